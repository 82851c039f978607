// Asked once: the key is kept in the browser and sent with every call.
import { useState } from 'preact/hooks';
import { saveKey } from './storage.js';

export function KeyPrompt({ error, onSaved }) {
  const [key, setKey] = useState('');
  const submit = (e) => {
    e.preventDefault();
    saveKey(key.trim());
    onSaved();
  };
  return (
    <form class="key-prompt" onSubmit={submit}>
      <h2>This server needs an API key</h2>
      <p>It is kept in this browser and sent with every request.</p>
      {error && <p class="error">{error}</p>}
      <input
        type="password"
        name="api-key"
        autocomplete="off"
        placeholder="API key"
        value={key}
        onInput={(e) => setKey(e.currentTarget.value)}
        autofocus
      />
      <button type="submit" disabled={!key.trim()}>
        Save key
      </button>
    </form>
  );
}
