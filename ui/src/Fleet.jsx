// The fleet at a glance: workers with their model and slots, queue and throughput; refreshes itself.
import { useEffect, useState } from 'preact/hooks';
import { AuthError, getJson, getText, parseMetrics } from './api.js';

const REFRESH_MS = 1000;
const BATCHES_SHOWN = 20; // the newest ones (GET /v1/batches lists newest first)

function age(seconds) {
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function Slot({ slot }) {
  const task = slot.id_task !== undefined && slot.id_task >= 0 ? ` · task ${slot.id_task}` : '';
  return (
    <div class={`slot ${slot.is_processing ? 'busy' : 'idle'}`} title={`slot ${slot.id}`}>
      <span class="slot-id">#{slot.id}</span>
      <span>{slot.is_processing ? `busy${task}` : 'idle'}</span>
    </div>
  );
}

// What --fit decided: the context, the layers it offloads, and per device what the model,
// its KV cache and compute buffers take (MiB).
function Fit({ fit }) {
  const layers = fit.n_gpu_layers === null || fit.n_gpu_layers === undefined
    ? '' : ` · ${fit.n_gpu_layers} layers offloaded`;
  return (
    <div class="worker-fit" title={fit.note}>
      <span>fit: ctx {fit.n_ctx}{layers}{fit.fits ? '' : ' (does not fit)'}</span>
      {(fit.memory || []).map((d) => (
        <span key={d.device} class="fit-device">
          {d.device}: model {d.model_mib} + KV {d.context_mib} + compute {d.compute_mib} MiB
          {' '}of {d.total_mib}
        </span>
      ))}
    </div>
  );
}

function Worker({ worker, now }) {
  const m = worker.metrics || {};
  const busy = (worker.slots || []).filter((s) => s.is_processing).length;
  return (
    <div class="worker" data-worker={worker.worker_id}>
      <div class="worker-head">
        <strong class="worker-id">{worker.worker_id}</strong>
        <span class="worker-model">{worker.model_id}</span>
        {worker.simulated ? <span class="worker-simulated">simulated</span> : null}
      </div>
      <div class="worker-facts">
        <span>{worker.n_slots} slots × {worker.n_ctx_slot} ctx</span>
        <span>{busy} busy</span>
        <span>{m.requests_deferred ?? 0} waiting</span>
        <span>up {age(now - worker.started_at)}</span>
      </div>
      {worker.fit ? <Fit fit={worker.fit} /> : null}
      {worker.slots ? (
        <div class="slots">{worker.slots.map((s) => <Slot key={s.id} slot={s} />)}</div>
      ) : (
        <p class="note">slots hidden (--no-slots)</p>
      )}
    </div>
  );
}

// Per priority: completions started, their mean wait in the queues, preemptions (--preempt).
function Priorities({ priorities }) {
  if (!priorities || priorities.length === 0) return '–';
  return priorities.map((p) => (
    <div key={p.priority} class="tenant-priority" data-priority={p.priority}>
      p{p.priority}: <span class="started">{p.started}</span> started, mean wait{' '}
      <span class="mean-wait">{p.mean_wait_s.toFixed(2)}</span> s,{' '}
      <span class="preempted">{p.preempted}</span> preempted
    </div>
  ));
}

// Under --tenants: each tenant's counters since the fleet's Redis started, its jobs now and
// its limits (an unset limit is unlimited).
function Tenants({ tenants }) {
  const limit = (value) => (value === null || value === undefined ? '–' : value);
  return (
    <table class="batches tenants">
      <thead>
        <tr>
          <th>tenant</th><th>requests</th><th>tokens</th><th>429s</th><th>active</th>
          <th>by priority</th><th>max concurrent</th><th>requests/min</th><th>tokens/min</th>
          <th>priority</th>
        </tr>
      </thead>
      <tbody>
        {tenants.map((t) => (
          <tr key={t.name} data-tenant={t.name}>
            <td class="tenant-name">{t.name}</td>
            <td class="tenant-requests">{t.requests}</td>
            <td class="tenant-tokens">{t.tokens}</td>
            <td class="tenant-limited">{t.limited}</td>
            <td class="tenant-active">{t.active}</td>
            <td class="tenant-priorities"><Priorities priorities={t.priorities} /></td>
            <td>{limit(t.limits.max_concurrent)}</td>
            <td>{limit(t.limits.requests_per_minute)}</td>
            <td>{limit(t.limits.tokens_per_minute)}</td>
            <td>{t.limits.priority}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function Batches({ batches, note }) {
  if (note) return <p class="note" id="batches-note">{note}</p>;
  if (!batches) return <p class="note">loading…</p>;
  if (batches.length === 0) return <p class="note" id="batches-note">No batch yet.</p>;
  return (
    <table class="batches">
      <thead>
        <tr>
          <th>batch</th><th>status</th><th>progress</th><th>completed</th><th>failed</th>
          <th>total</th><th>created</th>
        </tr>
      </thead>
      <tbody>
        {batches.map((b) => {
          const counts = b.request_counts || {};
          const done = (counts.completed || 0) + (counts.failed || 0);
          const progress = counts.total ? `${Math.round((100 * done) / counts.total)} %` : '–';
          return (
            <tr key={b.id} data-batch={b.id}>
              <td class="batch-id">{b.id}</td>
              <td class="batch-status">{b.status}</td>
              <td class="batch-progress">{progress}</td>
              <td class="batch-completed">{counts.completed ?? 0}</td>
              <td class="batch-failed">{counts.failed ?? 0}</td>
              <td class="batch-total">{counts.total ?? 0}</td>
              <td>{new Date(b.created_at * 1000).toLocaleString()}</td>
            </tr>
          );
        })}
      </tbody>
    </table>
  );
}

export function Fleet({ onAuthError }) {
  const [fleet, setFleet] = useState(null);
  const [metrics, setMetrics] = useState(null);
  const [metricsNote, setMetricsNote] = useState('');
  const [batches, setBatches] = useState(null);
  const [batchesNote, setBatchesNote] = useState('');
  const [error, setError] = useState('');
  const [updated, setUpdated] = useState(null);

  useEffect(() => {
    let stopped = false;
    let timer;
    let metricsOff = false; // a 501: the server runs without --metrics, ask no more
    async function tick() {
      try {
        const data = await getJson('fleet');
        if (stopped) return;
        setFleet(data);
        setError('');
        setUpdated(new Date());
      } catch (e) {
        if (e instanceof AuthError) return onAuthError();
        if (!stopped) setError(e.message);
      }
      try {
        if (metricsOff) throw null;
        const text = await getText('metrics');
        if (!stopped) {
          setMetrics(parseMetrics(text));
          setMetricsNote('');
        }
      } catch (e) {
        if (e && e.status === 501) metricsOff = true;
        if (!stopped && e) {
          setMetrics(null);
          setMetricsNote(`not available: ${e.message}`);
        }
      }
      try {
        const list = await getJson(`v1/batches?limit=${BATCHES_SHOWN}`);
        if (!stopped) {
          setBatches(list.data || []);
          setBatchesNote('');
        }
      } catch (e) {
        if (e instanceof AuthError) return onAuthError();
        if (!stopped) setBatchesNote(`not available: ${e.message}`);
      }
      if (!stopped) timer = setTimeout(tick, REFRESH_MS);
    }
    tick();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, []);

  const now = Date.now() / 1000;
  const workers = (fleet && fleet.workers) || [];
  return (
    <main class="fleet">
      <section class="fleet-summary">
        <div class="stat">
          <span class="value" id="worker-count">{workers.length}</span>
          <span class="label">workers</span>
        </div>
        <div class="stat">
          <span class="value">{workers.reduce((n, w) => n + w.n_slots, 0)}</span>
          <span class="label">slots</span>
        </div>
        <div class="stat">
          <span class="value">
            {workers.reduce((n, w) => n + (w.slots || []).filter((s) => s.is_processing).length, 0)}
          </span>
          <span class="label">busy slots</span>
        </div>
        <div class="stat">
          <span class="value" id="queue-depth">{fleet ? fleet.queued : '–'}</span>
          <span class="label">
            queued jobs
            {fleet && fleet.queued ? ` · oldest ${age(fleet.oldest_queued_s)}` : ''}
          </span>
        </div>
      </section>
      <section class="metrics">
        <h3>Throughput (/metrics)</h3>
        {metrics ? (
          <div class="fleet-summary">
            <div class="stat">
              <span class="value">{metrics.predicted_tokens_seconds.toFixed(1)}</span>
              <span class="label">gen tok/s (avg)</span>
            </div>
            <div class="stat">
              <span class="value">{metrics.prompt_tokens_seconds.toFixed(1)}</span>
              <span class="label">prompt tok/s (avg)</span>
            </div>
            <div class="stat">
              <span class="value">{metrics.tokens_predicted_total ?? metrics.tokens_predicted}</span>
              <span class="label">tokens generated</span>
            </div>
            <div class="stat">
              <span class="value">{metrics.requests_processing}</span>
              <span class="label">processing</span>
            </div>
            <div class="stat">
              <span class="value">{metrics.requests_deferred}</span>
              <span class="label">deferred</span>
            </div>
            {metrics.jobs_retried_total !== undefined && (
              <div class="stat">
                <span class="value">{metrics.jobs_retried_total}</span>
                <span class="label">jobs retried</span>
              </div>
            )}
            {metrics.jobs_failed_total !== undefined && (
              <div class="stat">
                <span class="value">{metrics.jobs_failed_total}</span>
                <span class="label">jobs failed</span>
              </div>
            )}
          </div>
        ) : (
          <p class="note" id="metrics-note">{metricsNote || 'loading…'}</p>
        )}
      </section>
      <section>
        <h3>Workers</h3>
        {error && <p class="error">{error}</p>}
        {fleet && workers.length === 0 && <p class="note">No live worker.</p>}
        <div class="workers">
          {workers.map((w) => <Worker key={w.worker_id} worker={w} now={now} />)}
        </div>
      </section>
      {fleet && fleet.tenants ? (
        <section>
          <h3>Tenants</h3>
          <Tenants tenants={fleet.tenants} />
        </section>
      ) : null}
      <section>
        <h3>Batches</h3>
        <Batches batches={batches} note={batchesNote} />
      </section>
      <p class="updated">{updated ? `updated ${updated.toLocaleTimeString()}` : ''}</p>
    </main>
  );
}
