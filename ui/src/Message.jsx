// One message: Markdown, folded reasoning, live figures from `timings`, copy / edit / regenerate.
import { useState } from 'preact/hooks';
import { renderMarkdown } from './markdown.js';

function fmt(value, digits = 1) {
  return Number.isFinite(value) ? value.toFixed(digits) : '–';
}

function Figures({ timings }) {
  if (!timings) return null;
  return (
    <div class="figures">
      <span title="prompt tokens evaluated">prompt {timings.prompt_n ?? 0} tok</span>
      <span class="prompt-speed">{fmt(timings.prompt_per_second)} tok/s</span>
      <span title="generated tokens">gen {timings.predicted_n ?? 0} tok</span>
      <span class="gen-speed">{fmt(timings.predicted_per_second)} tok/s</span>
      <span class="cached" title="prompt tokens reused from the cache">
        cached {timings.cache_n ?? 0}
      </span>
    </div>
  );
}

function ToolCalls({ calls }) {
  if (!calls || !calls.length) return null;
  return (
    <div class="tool-calls">
      {calls.map((c, i) => (
        <div class="tool-call" key={c.id || i}>
          <span class="tool-name">{c.name || '…'}</span>
          <code class="tool-args">{c.arguments}</code>
        </div>
      ))}
    </div>
  );
}

// A tool's result, folded: the call it answers and what the pod's tool gave back.
function ToolResult({ message }) {
  return (
    <div class={`message tool${message.failed ? ' failed' : ''}`}>
      <details class="tool-result" open={message.failed}>
        <summary>
          Tool <span class="tool-name">{message.name}</span> {message.failed ? 'failed' : 'result'}
        </summary>
        <pre class="tool-output">{message.content}</pre>
      </details>
    </div>
  );
}

export function Message({ message, busy, streaming, onRegenerate, onEdit }) {
  if (message.role === 'tool') return <ToolResult message={message} />;
  const [editing, setEditing] = useState(false);
  const [text, setText] = useState(message.content);
  const [copied, setCopied] = useState(false);
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(message.content);
    } catch {
      const area = document.createElement('textarea');
      area.value = message.content;
      document.body.appendChild(area);
      area.select();
      document.execCommand('copy');
      area.remove();
    }
    setCopied(true);
    setTimeout(() => setCopied(false), 1200);
  };

  return (
    <div class={`message ${message.role}${streaming ? ' streaming' : ''}`}>
      <div class="role">{message.role === 'user' ? 'You' : message.model || 'Assistant'}</div>
      {message.reasoning && (
        <details class="reasoning">
          <summary>Reasoning{streaming && !message.content ? '…' : ''}</summary>
          <div class="markdown" dangerouslySetInnerHTML={{ __html: renderMarkdown(message.reasoning) }} />
        </details>
      )}
      {editing ? (
        <form
          class="edit"
          onSubmit={(e) => {
            e.preventDefault();
            setEditing(false);
            onEdit(text);
          }}
        >
          <textarea value={text} onInput={(e) => setText(e.currentTarget.value)} />
          <button type="submit">Save &amp; send</button>
          <button type="button" onClick={() => setEditing(false)}>
            Cancel
          </button>
        </form>
      ) : message.role === 'user' ? (
        <div class="content plain">{message.content}</div>
      ) : (
        <div class="content markdown" dangerouslySetInnerHTML={{ __html: renderMarkdown(message.content) }} />
      )}
      <ToolCalls calls={message.toolCalls} />
      {message.error && <div class="error">{message.error}</div>}
      {message.stopped && <div class="note">stopped</div>}
      {message.role === 'assistant' && <Figures timings={message.timings} />}
      {!streaming && !editing && (
        <div class="actions">
          <button onClick={copy}>{copied ? 'Copied' : 'Copy'}</button>
          {onEdit && (
            <button disabled={busy} onClick={() => { setText(message.content); setEditing(true); }}>
              Edit
            </button>
          )}
          {onRegenerate && (
            <button disabled={busy} onClick={onRegenerate}>
              Regenerate
            </button>
          )}
        </div>
      )}
    </div>
  );
}
