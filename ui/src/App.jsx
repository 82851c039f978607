// The page: asks for the API key when the server wants one, then the chat or the fleet view.
import { useEffect, useState } from 'preact/hooks';
import { AuthError, getJson } from './api.js';
import { Chat } from './Chat.jsx';
import { Fleet } from './Fleet.jsx';
import { KeyPrompt } from './KeyPrompt.jsx';
import { loadUserSettings, saveUserSettings } from './storage.js';
import { effective } from './settings.js';

function useHashRoute() {
  const [hash, setHash] = useState(location.hash);
  useEffect(() => {
    const onChange = () => setHash(location.hash);
    addEventListener('hashchange', onChange);
    return () => removeEventListener('hashchange', onChange);
  }, []);
  return hash === '#/fleet' ? 'fleet' : 'chat';
}

export function App() {
  const route = useHashRoute();
  const [needKey, setNeedKey] = useState(false);
  const [keyError, setKeyError] = useState('');
  const [models, setModels] = useState([]);
  const [model, setModel] = useState('');
  const [serverSettings, setServerSettings] = useState({});
  const [userSettings, setUserSettings] = useState(loadUserSettings);
  const [bootError, setBootError] = useState('');
  const [attempt, setAttempt] = useState(0);

  useEffect(() => {
    let cancelled = false;
    (async () => {
      // /props needs the key when the server has one (the page itself does not): a 401 here
      // means "ask for it". A 503 only means no worker yet: built-in defaults then.
      try {
        const props = await getJson('props');
        if (!cancelled) setServerSettings(props.ui_settings || {});
      } catch (error) {
        if (cancelled) return;
        if (error instanceof AuthError) {
          setNeedKey(true);
          if (attempt > 0) setKeyError('That key was refused: ' + error.message);
          return;
        }
      }
      try {
        const list = await getJson('v1/models');
        let status = {};
        try {
          const native = await getJson('models'); // status per model in router mode
          for (const m of native.data || []) if (m.status) status[m.id] = m.status;
        } catch {
          status = {};
        }
        if (cancelled) return;
        const found = (list.data || []).map((m) => ({ id: m.id, status: status[m.id] }));
        setModels(found);
        setModel((current) => current || (found[0] && found[0].id) || '');
        setNeedKey(false);
        setBootError('');
      } catch (error) {
        if (cancelled) return;
        if (error instanceof AuthError) {
          setNeedKey(true);
          return;
        }
        setBootError(error.message);
      }
    })();
    return () => {
      cancelled = true;
    };
  }, [attempt]);

  const onAuthError = () => {
    setKeyError('The server refused the stored key.');
    setNeedKey(true);
  };
  const changeSettings = (next) => {
    setUserSettings(next);
    saveUserSettings(next);
  };
  const settings = effective(serverSettings, userSettings);

  return (
    <div class="app">
      <header class="topbar">
        <span class="brand">llamaq</span>
        <nav>
          <a href="#/" class={route === 'chat' ? 'active' : ''}>Chat</a>
          <a href="#/fleet" class={route === 'fleet' ? 'active' : ''}>Fleet</a>
        </nav>
        <label class="model-picker">
          Model{' '}
          <select value={model} onChange={(e) => setModel(e.currentTarget.value)} aria-label="Model">
            {models.map((m) => (
              <option value={m.id} key={m.id}>
                {m.id}
                {m.status && m.status.value ? ` (${m.status.value})` : ''}
              </option>
            ))}
          </select>
        </label>
      </header>
      {bootError && <div class="banner error">{bootError}</div>}
      {needKey ? (
        <KeyPrompt
          error={keyError}
          onSaved={() => {
            setKeyError('');
            setAttempt((n) => n + 1);
          }}
        />
      ) : route === 'fleet' ? (
        <Fleet onAuthError={onAuthError} />
      ) : (
        <Chat
          model={model}
          settings={settings}
          serverSettings={serverSettings}
          userSettings={userSettings}
          onSettings={changeSettings}
          onAuthError={onAuthError}
        />
      )}
    </div>
  );
}
