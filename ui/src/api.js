// Calls to the api pod that serves this page: relative URLs (so --api-prefix works), the API key
// from the browser's storage on every call, SSE parsed from a fetch stream.
import { loadKey } from './storage.js';

export class AuthError extends Error {}

export function apiUrl(path) {
  return new URL(path.replace(/^\//, ''), document.baseURI).toString();
}

function headers(extra = {}) {
  const key = loadKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch {
    /* not JSON */
  }
  const error = response.status === 401 ? new AuthError(message) : new Error(message);
  error.status = response.status;
  return error;
}

export async function getJson(path) {
  const response = await fetch(apiUrl(path), { headers: headers() });
  if (!response.ok) throw await failure(response);
  return response.json();
}

// POST a JSON body and read the JSON answer (a server tool's failure is a 200 with `error`).
export async function postJson(path, body) {
  const response = await fetch(apiUrl(path), {
    method: 'POST',
    headers: headers({ 'Content-Type': 'application/json' }),
    body: JSON.stringify(body),
  });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const answer = await response.json();
      message = (answer.error && answer.error.message) || answer.message || message;
    } catch {
      /* not JSON */
    }
    const error = response.status === 401 ? new AuthError(message) : new Error(message);
    error.status = response.status;
    throw error;
  }
  return response.json();
}

export async function getText(path) {
  const response = await fetch(apiUrl(path), { headers: headers() });
  if (!response.ok) throw await failure(response);
  return response.text();
}

// POST a streaming request and call onEvent with every parsed `data:` JSON object (and onId
// with every SSE event id: the stream can be stopped at once with stopStream(id)).
export async function streamJson(path, body, signal, onEvent, onId = () => {}) {
  const response = await fetch(apiUrl(path), {
    method: 'POST',
    headers: headers({ 'Content-Type': 'application/json' }),
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await failure(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of block.split('\n')) {
        if (line.startsWith('id:')) onId(line.slice(3).trim());
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        const event = JSON.parse(data);
        if (event.error) throw new Error(event.error.message || 'stream error');
        onEvent(event);
      }
    }
  }
}

// Stop a streamed response now: aborting the fetch alone leaves its job a few seconds in which
// the stream could be resumed; the Stop button means it.
export async function stopStream(eventId) {
  const record = eventId.split('-')[0];
  await fetch(apiUrl(`v1/streams/${encodeURIComponent(record)}`), {
    method: 'DELETE',
    headers: headers(),
  });
}

// Prometheus text to {name: value}, the llamacpp: / llamaq: prefixes dropped; a labelled
// series is summed under its bare name as well (jobs_failed_total{cause=...}).
export function parseMetrics(text) {
  const values = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const match = line.trim().match(/^(?:llamacpp:|llamaq:)?([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/);
    if (!match) continue;
    const [, name, labels, value] = match;
    if (labels) values[name] = (values[name] || 0) + Number(value);
    else values[name] = Number(value);
  }
  return values;
}
