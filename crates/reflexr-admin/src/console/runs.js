// Runs: the list by filter, with bulk retry and discard of dead ones, and
// one run's page (with its progress and log, followed while it runs).

import { api, change, vocabulary } from './api.js';
import { act } from './dialogs.js';
import { enc, h, kv, num, pre, table, when } from './dom.js';
import { eventLink } from './events.js';
import { canChange, notify, session, showError } from './session.js';
import { stream } from './stream.js';

function stateCell(state) {
  return h('span', { class: `state-${state}` }, state);
}

export function runLink(id) {
  return id ? h('a', { href: `#/run/${enc(id)}`, class: 'mono' }, id) : '–';
}

function runFilterFrom(query) {
  const f = {};
  for (const k of ['state', 'action', 'rule', 'workspace', 'scope']) {
    if (query.get(k)) f[k] = query.get(k);
  }
  const path = query.get('input_path');
  if (path) {
    const raw = query.get('input_value') ?? '';
    let value;
    try { value = JSON.parse(raw); } catch { value = raw; }
    f.input = { [path]: value };
  }
  return f;
}

/** Runs by filter, newest first, a page at a time; bulk retry/discard of dead ones. */
export async function runs(main, query) {
  const filter = runFilterFrom(query);
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(filter)) if (k !== 'input') q.set(k, v);
  if (filter.input) {
    const [[p, v]] = Object.entries(filter.input);
    q.set(`input.${p}`, typeof v === 'string' ? v : JSON.stringify(v));
  }
  if (query.get('before')) q.set('before', query.get('before'));
  const page = await api(`/api/v1/runs?${q}`);
  const input = (name, label, attrs = {}) => h('label', {}, label, h('input', { name, value: query.get(name) ?? '', ...attrs }));
  const form = h('form', { class: 'filters', role: 'search' },
    h('label', {}, 'State', h('select', { name: 'state' },
      h('option', { value: '' }, 'any'),
      vocabulary.runStates.map((st) => h('option', { value: st, selected: st === filter.state }, st)))),
    input('action', 'Action'),
    input('rule', 'Rule'),
    input('scope', 'Scope'),
    input('input_path', 'Input key or $.path', { placeholder: 'session' }),
    input('input_value', 'holds (JSON or text)', { placeholder: '42' }),
    h('button', { type: 'submit', class: 'primary' }, 'Search'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const next = new URLSearchParams();
    for (const el of form.elements) if (el.name && el.value.trim()) next.set(el.name, el.value.trim());
    location.hash = `#/runs?${next}`;
  });
  main.append(h('h1', {}, 'Runs'), form);
  if (filter.state === 'dead' && canChange()) {
    main.append(h('div', { class: 'toolbar' },
      bulkButton('Retry all matching…', '/api/v1/runs/retry', { ...filter }, 'dead runs', 'retry'),
      bulkButton('Discard all matching…', '/api/v1/runs/discard', { ...filter }, 'dead runs', 'discard')));
  }
  main.append(table('Runs, newest first', [
    { label: 'id', cell: (r) => runLink(r.id) },
    { label: 'state', cell: (r) => stateCell(r.state) },
    { label: 'kind', cell: (r) => r.kind },
    { label: 'action', cell: (r) => r.action },
    { label: 'rule', cell: (r) => r.rule ?? '–' },
    { label: 'scope', cell: (r) => r.scope ?? '–' },
    { label: 'attempt', cell: (r) => `${r.attempt} of ${r.max_attempts}`, class: 'num' },
    { label: 'last error', cell: (r) => r.last_error ?? '', class: 'wrap' },
    { label: 'updated', cell: (r) => when(r.updated_at) },
  ], page.runs, { empty: 'No run matches.' }));
  if (page.next !== null) {
    const older = new URLSearchParams(query);
    older.set('before', page.next);
    main.append(h('p', {}, h('a', { href: `#/runs?${older}` }, 'Older runs')));
  }
  return undefined;
}

/**
 * "… all matching": asks the server what the filter matches (a dry run),
 * states how many, and acts on exactly those ids once confirmed.
 */
export function bulkButton(label, path, filter, what, verb) {
  return h('button', {
    type: 'button',
    class: verb === 'discard' ? 'danger' : undefined,
    onclick: async () => {
      let dry;
      try {
        dry = await api(path, { method: 'POST', body: { filter, operator: session.operator || 'console', reason: 'dry run' } });
      } catch (e) {
        showError(e);
        return;
      }
      if (!dry.matched) {
        notify(`No ${what} match the filter: nothing to ${verb}.`, 'info');
        return;
      }
      await act({
        title: `${verb === 'retry' ? 'Retry' : 'Discard'} ${dry.matched} ${what}?`,
        text: `The filter matches ${dry.matched} ${what}${dry.more ? ' (and more beyond them)' : ''}. Exactly these will be ${verb === 'retry' ? 'retried' : 'discarded'}:`,
        items: dry.ids.map(String),
        more: dry.more,
        action: `${verb === 'retry' ? 'Retry' : 'Discard'} ${dry.matched}`,
      }, (who) => change(path, who, { ids: dry.ids, confirm: true }),
      (r) => `${verb === 'retry' ? 'Retried' : 'Discarded'} ${r.done.length}`
        + `${r.skipped.length ? `; ${r.skipped.length} had moved on and were left as they were` : ''}.`);
    },
  }, label);
}

/** What a step waits (or waited) for, in words: a sleep's time, a wait's event, a join's runs. */
function waitsFor(step) {
  const d = step.detail ?? {};
  switch (step.kind) {
    case 'sleep':
      return `until ${when(d.until)}`;
    case 'wait': {
      let what = `${d.type} in ${d.workspace}`;
      if (d.subject !== undefined) what += ` about ${d.subject}`;
      if (d.field !== undefined) what += ` with ${d.field} = ${JSON.stringify(d.value)}`;
      return d.timeout_at === null || d.timeout_at === undefined
        ? `${what}, for as long as it takes`
        : `${what}, until ${when(d.timeout_at)}`;
    }
    case 'join':
      return h('span', {}, 'runs ', (d.runs ?? []).flatMap((id, i) => [i ? ', ' : null, runLink(id)]));
    default:
      return '';
  }
}

/** A step's output: its size, and the JSON it holds on demand. */
function outputCell(step) {
  const size = `${num(step.output_bytes)} B`;
  if (step.output === null || step.output === undefined) return step.state === 'waiting' ? '–' : size;
  return h('details', { class: 'output' }, h('summary', {}, size), pre(step.output));
}

/**
 * The reset of a run to one of its steps: it and every step after it are
 * forgotten and run again, so the dialog says what may happen again and
 * asks for the step's name to be typed.
 */
function resetButton(r, step, steps) {
  const later = steps.filter((x) => x.position > step.position).length;
  return h('button', {
    type: 'button',
    class: 'danger',
    data: { action: 'reset', step: step.name },
    onclick: () => act({
      title: `Reset the run to step ${step.name}`,
      text: `Step ${step.name}${later ? ` and the ${later} step${later === 1 ? '' : 's'} after it` : ''} will be forgotten, and the run runs again from there with fresh attempts (the steps before it keep what they recorded). What ${later ? 'they' : 'it'} did outside the file — a charge, a mail, a call — may happen again.`,
      typed: step.name,
      action: 'Reset to this step',
    }, (who) => change(`/api/v1/runs/${enc(r.id)}/reset`, who, { step: step.name }),
    () => `The run was reset to step ${step.name}: it is ready to run again from there.`),
  }, 'Reset to this step…');
}

/** A workflow's timeline: each step as recorded, what a waiting one waits for, and the reset. */
function timeline(r, steps) {
  const columns = [
    { label: '#', cell: (s) => String(s.position), class: 'num' },
    { label: 'step', cell: (s) => h('span', { class: 'mono' }, s.name) },
    { label: 'kind', cell: (s) => s.kind },
    { label: 'state', cell: (s) => h('span', { class: `step-${s.state}` }, s.state) },
    { label: 'when', cell: (s) => when(s.recorded_at) },
    { label: 'attempt', cell: (s) => String(s.attempt), class: 'num' },
    { label: 'output', cell: outputCell },
    { label: 'waits for', cell: waitsFor, class: 'wrap' },
    { label: 'wakes', cell: (s) => (s.state === 'waiting' ? when(s.wake_at) : '–') },
  ];
  // The engine refuses a running run and one waiting behind its scope.
  if (canChange() && !['running', 'waiting'].includes(r.state)) {
    columns.push({ label: 'actions', cell: (s) => (s.kind === 'begin' ? '' : resetButton(r, s, steps)) });
  }
  return h('section', { id: 'timeline' },
    h('h2', {}, 'Steps'),
    h('p', { class: 'hint' }, 'The steps this workflow recorded, in the order its handler reached them.'),
    table('Steps, in order', columns, steps));
}

/** The states a run does not leave. */
const ENDED = ['succeeded', 'dead', 'discarded', 'cancelled'];

/** A run's progress: a bar with done of total, the attempt and when. */
function progressView(p) {
  if (!p) return h('p', { class: 'empty' }, 'Its handler has not said how far it got.');
  return h('p', { class: 'progress' },
    h('progress', { max: Math.max(p.total, 1), value: Math.min(p.done, Math.max(p.total, 1)) }),
    ` ${num(p.done)} / ${num(p.total)}`,
    h('span', { class: 'hint' }, ` (attempt ${p.attempt}, ${when(p.at)})`));
}

function logRow(l) {
  return h('tr', { data: { n: String(l.n) } },
    h('td', {}, when(l.at)),
    h('td', { class: 'num' }, String(l.attempt)),
    h('td', { class: `level-${l.level}` }, l.level),
    h('td', { class: 'wrap' }, l.message),
    h('td', { class: 'wrap mono' }, l.fields === null || l.fields === undefined ? '' : JSON.stringify(l.fields)));
}

/**
 * A run's progress and log lines, read a page at a time from
 * /api/v1/runs/{id}/logs; while the run runs, asked again every second
 * for the lines after the last (the runs stream says when it started and
 * ended). Returns the section and its stop.
 */
function runLog(r, setState) {
  const bar = h('div', { id: 'run-progress' });
  const body = h('tbody', {});
  const empty = h('p', { class: 'empty', id: 'run-logs-empty', hidden: true }, 'No lines logged.');
  const lines = h('table', { id: 'run-logs', hidden: true },
    h('caption', {}, 'Log lines, oldest first'),
    h('thead', {}, h('tr', {}, ['time', 'attempt', 'level', 'message', 'fields'].map((c) => h('th', { scope: 'col' }, c)))),
    body);
  const list = h('div', { class: 'table-wrap' }, lines, empty);
  let next = 0;
  let state = r.state;
  let timer = null;
  let busy = false;
  let stopped = false;
  const fetchMore = async () => {
    if (busy || stopped) return;
    busy = true;
    try {
      for (;;) {
        const page = await api(`/api/v1/runs/${enc(r.id)}/logs?after=${next}&limit=1000`);
        if (stopped) return;
        bar.replaceChildren(progressView(page.progress));
        body.append(...page.logs.map(logRow));
        next = page.next;
        if (page.logs.length < 1000) break;
      }
      lines.hidden = body.childElementCount === 0;
      empty.hidden = !lines.hidden;
    } catch (e) {
      showError(e);
    } finally {
      busy = false;
    }
  };
  const follow = () => {
    if (state === 'running' && !timer) timer = setInterval(fetchMore, 1000);
    if (state !== 'running' && timer) { clearInterval(timer); timer = null; }
  };
  const unsubscribe = ENDED.includes(r.state) ? null : stream.subscribe('runs', {}, (m) => {
    if (m.run?.id !== r.id || m.run.state === state) return;
    state = m.run.state;
    setState(state);
    // The lines of the attempt that just ended, or began.
    fetchMore();
    follow();
  });
  fetchMore();
  follow();
  const section = h('section', { id: 'run-log' },
    h('h2', {}, 'Progress and log'),
    bar,
    list);
  const stop = () => {
    stopped = true;
    if (timer) clearInterval(timer);
    unsubscribe?.();
  };
  return [section, stop];
}

/** A run: its fields, input, checkpoint, the event that fired it, what it emitted, a workflow's steps, its progress and log. */
export async function runPage(main, query, [id]) {
  const d = await api(`/api/v1/runs/${enc(id)}`);
  const r = d.run;
  main.append(
    h('h1', {}, `Run ${r.action}`),
    kv([
      ['id', h('span', { class: 'mono' }, r.id)],
      ['state', h('span', { id: 'run-state' }, stateCell(r.state))],
      ['kind', r.kind],
      ['rule', r.rule ?? '–'],
      ['scope', r.scope ?? '–'],
      ['workspace', r.workspace ?? '–'],
      ['attempt', `${r.attempt} of ${r.max_attempts}`],
      ['priority', String(r.priority)],
      r.unique_key ? ['unique', `${r.unique_key} (${r.unique_mode})`] : null,
      r.cancelled_by ? ['cancelled by', `${r.cancelled_by}: ${r.cancel_reason ?? ''}`] : null,
      ['last error', r.last_error ?? '–'],
      ['due', when(r.due_at)],
      ['claimed by', r.claimed_by ?? '–'],
      r.traceparent ? ['trace', h('span', { class: 'mono', id: 'run-trace' }, r.traceparent)] : null,
      ['created', when(r.created_at)],
      ['updated', when(r.updated_at)],
      ['finished', when(r.finished_at)],
      r.parent ? ['parent', runLink(r.parent)] : null,
    ]));
  if (['waiting', 'ready', 'running'].includes(r.state) && canChange()) {
    main.append(h('div', { class: 'toolbar' },
      h('button', {
        type: 'button',
        class: 'danger',
        id: 'cancel-run',
        onclick: () => act({
          title: 'Cancel this run',
          text: r.state === 'running'
            ? 'It is running: its handler is asked to stop, and its completion will be refused.'
            : 'It will never start.',
          action: 'Cancel the run',
        }, (who) => change(`/api/v1/runs/${enc(r.id)}/cancel`, who), () => 'The run was cancelled.'),
      }, 'Cancel…')));
  }
  if (r.state === 'dead' && canChange()) {
    main.append(h('div', { class: 'toolbar' },
      h('button', {
        type: 'button',
        class: 'primary',
        onclick: () => act({ title: 'Retry this run', text: 'It gets a fresh set of attempts.', action: 'Retry' },
          (who) => change(`/api/v1/runs/${enc(r.id)}/retry`, who), () => 'The run will be retried.'),
      }, 'Retry…'),
      h('button', {
        type: 'button',
        class: 'danger',
        onclick: () => act({ title: 'Discard this run', text: 'It will not run again; its scope goes on.', action: 'Discard' },
          (who) => change(`/api/v1/runs/${enc(r.id)}/discard`, who), () => 'The run was discarded.'),
      }, 'Discard…')));
  }
  const [log, stopLog] = runLog(r, (state) => { main.querySelector('#run-state')?.replaceChildren(stateCell(state)); });
  main.append(log);
  if (d.steps.length) main.append(timeline(r, d.steps));
  main.append(h('h2', {}, 'Input'), pre(r.input));
  main.append(h('h2', {}, 'Checkpoint'), r.checkpoint === null ? h('p', { class: 'empty' }, 'None saved.') : pre(r.checkpoint));
  if (r.output !== null) main.append(h('h2', {}, 'Output'), pre(r.output));
  main.append(h('h2', {}, 'Fired by'), d.event
    ? h('div', {}, h('p', {}, eventLink(d.event.workspace, d.event.id, `#${d.event.seq} ${d.event.type} (${d.event.subject})`)), pre(d.event.payload))
    : h('p', { class: 'empty' }, 'No event (a delivery or a scheduled job, or the event was pruned).'));
  main.append(h('h2', {}, 'Emitted'), d.emitted.length
    ? h('ul', {}, d.emitted.map((e) => h('li', {}, eventLink(e.workspace, e.id, `#${e.seq} ${e.type} (${e.subject})`))))
    : h('p', { class: 'empty' }, 'Nothing.'));
  return stopLog;
}
