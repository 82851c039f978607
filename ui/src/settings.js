// Chat settings: built-in defaults < the server's --ui-config (ui_settings in /props) < the
// user's own changes (kept in the browser). Key names as llama-server's UI (settings-keys.ts).
export const FIELDS = [
  { key: 'systemMessage', label: 'System prompt', type: 'text' },
  { key: 'temperature', label: 'Temperature', type: 'number', step: 0.05 },
  { key: 'top_k', label: 'Top K', type: 'number', step: 1 },
  { key: 'top_p', label: 'Top P', type: 'number', step: 0.01 },
  { key: 'min_p', label: 'Min P', type: 'number', step: 0.01 },
  { key: 'max_tokens', label: 'Max tokens (-1: no limit)', type: 'number', step: 1 },
];

export const BUILTIN = {
  systemMessage: '',
  temperature: 0.8,
  top_k: 40,
  top_p: 0.95,
  min_p: 0.05,
  max_tokens: -1,
};

export function effective(server, user) {
  const out = { ...BUILTIN };
  for (const source of [server || {}, user || {}]) {
    for (const { key } of FIELDS) if (source[key] !== undefined) out[key] = source[key];
  }
  return out;
}

// The sampling fields of a chat request.
export function samplingBody(s) {
  const body = {
    temperature: Number(s.temperature),
    top_k: Number(s.top_k),
    top_p: Number(s.top_p),
    min_p: Number(s.min_p),
  };
  if (Number(s.max_tokens) > 0) body.max_tokens = Number(s.max_tokens);
  return body;
}
