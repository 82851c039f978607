// Conversations kept in the browser, streamed answers, stop / regenerate / edit / copy.
import { useEffect, useRef, useState } from 'preact/hooks';
import { AuthError, stopStream, streamJson } from './api.js';
import { Message } from './Message.jsx';
import { SettingsPanel } from './SettingsPanel.jsx';
import { loadConversations, newId, saveConversations } from './storage.js';
import { samplingBody } from './settings.js';
import { MAX_TOOL_ROUNDS, loadTools, mergeToolCalls, runToolCall, toolResultText, wireMessage } from './tools.js';

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
  const [tools, setTools] = useState([]); // the api pod's server tools (none: the feature is off)
  const [toolMode, setToolMode] = useState('off'); // off, auto, required (the first answer)
  const controller = useRef(null);
  const bottom = useRef(null);
  const current = conversations.find((c) => c.id === currentId) || conversations[0];

  useEffect(() => saveConversations(conversations), [conversations]);
  useEffect(() => {
    loadTools().then(setTools);
  }, []);
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

  // Ask for an answer to `history` (which ends with a user or tool message) in conversation
  // `id`; with server tools on, the model's tool calls run on the pod and it answers again.
  async function answer(id, history, round = 0) {
    const abort = new AbortController();
    abort.eventId = null;
    controller.current = abort;
    setBusy(true);
    const reply = { id: newId(), role: 'assistant', content: '', reasoning: '', model, toolCalls: [] };
    update(id, (c) => ({ ...c, messages: [...history, reply] }));
    const messages = history.map(wireMessage);
    if (settings.systemMessage) messages.unshift({ role: 'system', content: settings.systemMessage });
    const body = {
      model,
      messages,
      stream: true,
      timings_per_token: true,
      ...samplingBody(settings),
    };
    const useTools = toolMode !== 'off' && tools.length > 0;
    if (useTools) {
      body.tools = tools.map((t) => t.definition);
      body.tool_choice = toolMode === 'required' && round === 0 ? 'required' : 'auto';
    }
    let calls = [];
    let content = '';
    let next = null;
    try {
      await streamJson('v1/chat/completions', body, abort.signal, (event) => {
        const choice = (event.choices && event.choices[0]) || {};
        const delta = choice.delta || {};
        content += delta.content || '';
        if (delta.tool_calls) calls = mergeToolCalls(calls, delta.tool_calls);
        patchLast(id, (last) => ({
          content: last.content + (delta.content || ''),
          reasoning: last.reasoning + (delta.reasoning_content || ''),
          toolCalls: calls,
          timings: event.timings || last.timings,
          finish: choice.finish_reason || last.finish,
        }));
      }, (eventId) => {
        abort.eventId = eventId;
      });
      if (useTools && calls.length && round < MAX_TOOL_ROUNDS) {
        const results = [];
        for (const call of calls) {
          const result = await runToolCall(call);
          results.push({
            id: newId(),
            role: 'tool',
            name: call.name,
            toolCallId: call.id,
            arguments: call.arguments,
            failed: Boolean(result && result.error),
            content: toolResultText(result),
          });
          if (abort.signal.aborted) break;
        }
        if (!abort.signal.aborted) {
          next = [...history, { ...reply, content, toolCalls: calls }, ...results];
          update(id, (c) => ({ ...c, messages: next }));
        }
      }
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
      if (!next) setFinished((n) => n + 1);
    }
    if (next) await answer(id, next, round + 1);
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
              onRegenerate={m.role === 'assistant' && !(m.toolCalls && m.toolCalls.length) ? () => regenerate(i) : null}
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
          {tools.length > 0 && (
            <label class="tool-mode" title="Let the model call the server's tools (they run on the api pod)">
              Tools ({tools.length})
              <select name="tool-mode" value={toolMode} onChange={(e) => setToolMode(e.currentTarget.value)}>
                <option value="off">off</option>
                <option value="auto">auto</option>
                <option value="required">required</option>
              </select>
            </label>
          )}
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
