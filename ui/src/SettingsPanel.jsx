// The chat settings; a field the user has not changed shows the server's default.
import { FIELDS } from './settings.js';

export function SettingsPanel({ settings, serverSettings, userSettings, onChange, onClose }) {
  const set = (key, value) => onChange({ ...userSettings, [key]: value });
  return (
    <section class="settings" aria-label="Settings">
      <h3>Settings</h3>
      {FIELDS.map((f) => (
        <label key={f.key}>
          <span>
            {f.label}
            {serverSettings[f.key] !== undefined && <em class="from-server"> (server default)</em>}
          </span>
          {f.type === 'text' ? (
            <textarea
              name={f.key}
              value={settings[f.key]}
              onInput={(e) => set(f.key, e.currentTarget.value)}
            />
          ) : (
            <input
              name={f.key}
              type="number"
              step={f.step}
              value={settings[f.key]}
              onInput={(e) => set(f.key, e.currentTarget.value === '' ? undefined : Number(e.currentTarget.value))}
            />
          )}
        </label>
      ))}
      <div class="settings-buttons">
        <button type="button" onClick={() => onChange({})}>
          Reset to defaults
        </button>
        <button type="button" onClick={onClose}>
          Close
        </button>
      </div>
    </section>
  );
}
