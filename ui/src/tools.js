// Server tools (GET/POST /tools, docs/tools.md): the model's tool calls gathered from the stream's
// deltas, each run on the api pod, its result sent back as a `tool` message.
import { getJson, postJson } from './api.js';

export const MAX_TOOL_ROUNDS = 8;

// The pod's tools; none when the feature is off (403) or the request fails.
export async function loadTools() {
  try {
    const tools = await getJson('tools');
    return Array.isArray(tools) ? tools : [];
  } catch {
    return [];
  }
}

// Merge one delta's `tool_calls` pieces into `calls` (by index, arguments appended).
export function mergeToolCalls(calls, deltas) {
  const merged = calls.slice();
  for (const piece of deltas || []) {
    const at = piece.index ?? merged.length;
    const call = { ...(merged[at] || { id: '', name: '', arguments: '' }) };
    if (piece.id) call.id = piece.id;
    if (piece.function && piece.function.name) call.name += piece.function.name;
    if (piece.function && piece.function.arguments) call.arguments += piece.function.arguments;
    merged[at] = call;
  }
  return merged;
}

// Run one call; its answer (or why it could not run) as the tool message's content.
export async function runToolCall(call) {
  let params;
  try {
    params = call.arguments ? JSON.parse(call.arguments) : {};
  } catch (error) {
    return { error: `invalid arguments: ${error.message}` };
  }
  try {
    return await postJson('tools', { tool: call.name, params });
  } catch (error) {
    return { error: error.message };
  }
}

// The text a model reads back: the plain text when the tool gave one, else the JSON.
export function toolResultText(result) {
  if (result && typeof result.plain_text_response === 'string' && !result.error) {
    return result.plain_text_response;
  }
  return JSON.stringify(result);
}

// A stored message as the chat request wants it.
export function wireMessage(m) {
  if (m.role === 'tool') return { role: 'tool', tool_call_id: m.toolCallId, content: m.content };
  if (m.role === 'assistant' && m.toolCalls && m.toolCalls.length) {
    return {
      role: 'assistant',
      content: m.content,
      tool_calls: m.toolCalls.map((c) => ({
        id: c.id,
        type: 'function',
        function: { name: c.name, arguments: c.arguments || '{}' },
      })),
    };
  }
  return { role: m.role, content: m.content };
}
