// Conversations kept in the browser, streamed answers, stop / regenerate / edit / copy.
import { useEffect, useRef, useState } from 'preact/hooks';
import { AuthError, stopStream, streamJson } from './api.js';
import { Message } from './Message.jsx';
import { SettingsPanel } from './SettingsPanel.jsx';
import { loadConversations, newId, saveConversations } from './storage.js';
import { samplingBody } from './settings.js';

function emptyConversation() {
  return { id: newId(), title: 'New chat', messages: [], updated: Date.now() };
}

export function Chat({ model, settings, serverSettings, userSettings, onSettings, onAuthError }) {
  const [conversations, setConversations] = useState(() => {
    const list = loadConversations();
    return list.length ? list : [emptyConversation()];
  });
  const [currentId, setCurrentId] = useState(() => conversations[0].id);
  const [draft, setDraft] = useState('');
  const [busy, setBusy] = useState(false);
  const [finished, setFinished] = useState(0); // answers ended (done, stopped or failed)
  const [showSettings, setShowSettings] = useState(false);
  const controller = useRef(null);
  const bottom = useRef(null);
  const current = conversations.find((c) => c.id === currentId) || conversations[0];

  useEffect(() => saveConversations(conversations), [conversations]);
  useEffect(() => bottom.current && bottom.current.scrollIntoView({ block: 'end' }));

  const update = (id, change) =>
    setConversations((list) =>
      list.map((c) => (c.id === id ? { ...change(c), updated: Date.now() } : c)),
    );
  const patchLast = (id, patch) =>
    update(id, (c) => {
      const messages = c.messages.slice();
      const last = messages[messages.length - 1];
      messages[messages.length - 1] = { ...last, ...patch(last) };
      return { ...c, messages };
    });

  // Ask for an answer to `history` (which ends with a user message) in conversation `id`.
  async function answer(id, history) {
    const abort = new AbortController();
    abort.eventId = null;
    controller.current = abort;
    setBusy(true);
    const reply = { id: newId(), role: 'assistant', content: '', reasoning: '', model };
    update(id, (c) => ({ ...c, messages: [...history, reply] }));
    const messages = history.map((m) => ({ role: m.role, content: m.content }));
    if (settings.systemMessage) messages.unshift({ role: 'system', content: settings.systemMessage });
    const body = {
      model,
      messages,
      stream: true,
      timings_per_token: true,
      ...samplingBody(settings),
    };
    try {
      await streamJson('v1/chat/completions', body, abort.signal, (event) => {
        const choice = (event.choices && event.choices[0]) || {};
        const delta = choice.delta || {};
        patchLast(id, (last) => ({
          content: last.content + (delta.content || ''),
          reasoning: last.reasoning + (delta.reasoning_content || ''),
          timings: event.timings || last.timings,
          finish: choice.finish_reason || last.finish,
        }));
      }, (eventId) => {
        abort.eventId = eventId;
      });
    } catch (error) {
      if (abort.signal.aborted) {
        patchLast(id, () => ({ stopped: true }));
      } else {
        patchLast(id, () => ({ error: error.message }));
        if (error instanceof AuthError) onAuthError();
      }
    } finally {
      controller.current = null;
      setBusy(false);
      setFinished((n) => n + 1);
    }
  }

  const send = (e) => {
    if (e) e.preventDefault();
    const text = draft.trim();
    if (!text || busy) return;
    setDraft('');
    const message = { id: newId(), role: 'user', content: text };
    const history = [...current.messages, message];
    if (current.messages.length === 0) update(current.id, (c) => ({ ...c, title: text.slice(0, 40) }));
    answer(current.id, history);
  };
  const stop = () => {
    const abort = controller.current;
    if (!abort) return;
    abort.abort();
    if (abort.eventId) stopStream(abort.eventId).catch(() => {});
  };
  const regenerate = (index) => answer(current.id, current.messages.slice(0, index));
  const edit = (index, content) =>
    answer(current.id, [...current.messages.slice(0, index), { ...current.messages[index], content }]);

  const newChat = () => {
    const fresh = emptyConversation();
    setConversations((list) => [fresh, ...list]);
    setCurrentId(fresh.id);
  };
  const remove = (id) => {
    const rest = conversations.filter((c) => c.id !== id);
    const list = rest.length ? rest : [emptyConversation()];
    setConversations(list);
    if (id === currentId) setCurrentId(list[0].id);
  };

  return (
    <div class="chat-layout" data-busy={busy ? 'true' : 'false'} data-finished={finished}>
      <aside class="sidebar">
        <button class="new-chat" onClick={newChat} disabled={busy}>
          + New chat
        </button>
        <ul class="conversations">
          {conversations
            .slice()
            .sort((a, b) => b.updated - a.updated)
            .map((c) => (
              <li key={c.id} class={c.id === current.id ? 'active' : ''}>
                <button class="title" disabled={busy} onClick={() => setCurrentId(c.id)}>
                  {c.title}
                </button>
                <button class="icon" title="Delete" disabled={busy} onClick={() => remove(c.id)}>
                  ×
                </button>
              </li>
            ))}
        </ul>
        <button class="settings-toggle" onClick={() => setShowSettings(!showSettings)}>
          Settings
        </button>
      </aside>
      <main class="chat">
        {showSettings && (
          <SettingsPanel
            settings={settings}
            serverSettings={serverSettings}
            userSettings={userSettings}
            onChange={onSettings}
            onClose={() => setShowSettings(false)}
          />
        )}
        <div class="messages">
          {current.messages.length === 0 && <p class="hint">Send a message to start.</p>}
          {current.messages.map((m, i) => (
            <Message
              key={m.id}
              message={m}
              busy={busy}
              streaming={busy && i === current.messages.length - 1}
              onRegenerate={m.role === 'assistant' ? () => regenerate(i) : null}
              onEdit={m.role === 'user' ? (text) => edit(i, text) : null}
            />
          ))}
          <div ref={bottom} />
        </div>
        <form class="composer" onSubmit={send}>
          <textarea
            name="message"
            placeholder="Type a message (Enter to send, Shift+Enter for a new line)"
            value={draft}
            onInput={(e) => setDraft(e.currentTarget.value)}
            onKeyDown={(e) => {
              if (e.key === 'Enter' && !e.shiftKey) send(e);
            }}
          />
          {busy ? (
            <button type="button" class="stop" onClick={stop}>
              Stop
            </button>
          ) : (
            <button type="submit" class="send" disabled={!draft.trim() || !model}>
              Send
            </button>
          )}
        </form>
      </main>
    </div>
  );
}
