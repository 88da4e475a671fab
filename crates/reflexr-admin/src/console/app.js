// The reflexr console: one module, no dependencies, no build step.
//
// It reads the REST routes under /api/v1 and follows the WebSocket stream
// at /api/v1/stream, like any other client. The token, when the server
// wants one, is typed in once, kept in this tab's sessionStorage and sent
// as a header (and as the stream's first message): never in a URL.
// Everything shown is built with DOM calls and textContent, so nothing the
// file holds is ever parsed as HTML.

const RUN_STATES = ['waiting', 'ready', 'running', 'succeeded', 'dead', 'discarded', 'cancelled'];
const DEAD_LETTER_KINDS = ['rule', 'run', 'reaction', 'follower', 'delivery'];
const TAIL_MAX = 500;

// ----- small helpers -------------------------------------------------------

const $ = (sel, root = document) => root.querySelector(sel);

/** An element: `h('a', {href: '#/x'}, 'text', child)`. */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'data') Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

const SVG = 'http://www.w3.org/2000/svg';
function s(tag, attrs = {}) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

/** A time in ms since the epoch, as UTC with milliseconds. */
function when(ms) {
  if (ms === null || ms === undefined || ms === 0) return '–';
  const d = new Date(ms);
  return Number.isNaN(d.getTime()) ? String(ms) : d.toISOString().replace('T', ' ');
}

const num = (n) => (n ?? 0).toLocaleString('en');
const json = (v) => JSON.stringify(v, null, 2);
const enc = encodeURIComponent;

function table(caption, columns, rows, opts = {}) {
  if (!rows.length) {
    return h('div', { class: 'table-wrap' }, h('p', { class: 'empty' }, opts.empty ?? `No ${caption.toLowerCase()}.`));
  }
  return h('div', { class: 'table-wrap' },
    h('table', {},
      h('caption', {}, caption),
      h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col' }, c.label)))),
      h('tbody', {}, rows.map((r) => h('tr', { class: opts.rowClass?.(r) },
        columns.map((c) => h('td', { class: c.class }, c.cell(r))))))));
}

function kv(pairs) {
  return h('dl', { class: 'kv' }, pairs.filter(Boolean).flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

function pre(value) {
  return h('pre', { class: 'json' }, typeof value === 'string' ? value : json(value));
}

// ----- the session: token, operator, read-only ------------------------------

const session = {
  get token() { return sessionStorage.getItem('reflexr.token') ?? ''; },
  set token(v) { if (v) sessionStorage.setItem('reflexr.token', v); else sessionStorage.removeItem('reflexr.token'); },
  get operator() { return sessionStorage.getItem('reflexr.operator') ?? ''; },
  set operator(v) { if (v) sessionStorage.setItem('reflexr.operator', v); },
  readOnly: false,
};

const canChange = () => !session.readOnly;

// ----- notices -------------------------------------------------------------

function describe(e) {
  if (e instanceof ApiError) {
    return e.status ? `${e.status} ${e.code}: ${e.message}` : e.message;
  }
  return String(e?.message ?? e);
}

function notify(text, kind = 'error') {
  const box = $('#notice');
  $('#notice-text').textContent = text;
  box.classList.toggle('info', kind === 'info');
  box.hidden = false;
}

function showError(e) {
  notify(describe(e));
}

// ----- the API -------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(path, { method = 'GET', body } = {}) {
  const headers = { Accept: 'application/json' };
  if (session.token) headers.Authorization = `Bearer ${session.token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
    });
  } catch (e) {
    throw new ApiError(0, 'unreachable', `The server did not answer: ${e.message}`);
  }
  let data = null;
  try { data = await res.json(); } catch { /* not JSON: said below */ }
  if (!res.ok) {
    const err = data?.error ?? {};
    const e = new ApiError(res.status, err.code ?? `http_${res.status}`, err.message ?? res.statusText);
    if (res.status === 401) askForToken(e);
    throw e;
  }
  return data;
}

/** POST a change, with who and why. */
function change(path, who, extra = {}) {
  return api(path, { method: 'POST', body: { operator: who.operator, reason: who.reason, ...extra } });
}

// ----- dialogs -------------------------------------------------------------

let signingIn = null;

/** The sign-in dialog, after a 401: says whether the token was wrong. */
function askForToken(e) {
  const dialog = $('#login');
  if (dialog.open) return;
  const had = Boolean(session.token);
  session.token = '';
  const why = had
    ? `The token was refused (${e.message}). Enter the right one.`
    : 'This server asks for a token.';
  $('#login-why').textContent = why;
  if (had) notify(`The token was refused: ${e.message}.`);
  const form = $('#login-form');
  form.operator.value = session.operator;
  form.token.value = '';
  signingIn = () => {
    session.token = form.token.value.trim();
    session.operator = form.operator.value.trim();
    $('#notice').hidden = true;
    boot();
  };
  dialog.showModal();
}

/**
 * Asks before a change. Resolves to {operator, reason, ...fields} or null.
 * `typed`: a word the operator must type to confirm (destructive changes).
 */
function confirmChange({ title, text, items = [], more = false, typed, fields = [], action = 'Confirm' }) {
  const dialog = h('dialog', { 'aria-labelledby': 'confirm-title', class: 'confirm' });
  const inputs = {};
  const field = (name, label, attrs = {}) => {
    inputs[name] = h('input', { name, required: true, autocomplete: 'off', ...attrs });
    return h('label', {}, label, ' ', inputs[name]);
  };
  const ok = h('button', { type: 'submit', class: 'danger', id: 'confirm-ok' }, action);
  const cancel = h('button', { type: 'button', id: 'confirm-cancel' }, 'Cancel');
  const form = h('form', { method: 'dialog' },
    h('h2', { id: 'confirm-title' }, title),
    h('p', { id: 'confirm-text' }, text),
    items.length ? h('ul', {}, items.slice(0, 50).map((i) => h('li', { class: 'mono' }, i)),
      items.length > 50 ? h('li', {}, `… and ${items.length - 50} more`) : null) : null,
    more ? h('p', { class: 'hint' }, 'More match than one action takes: run it again for the rest.') : null,
    fields.map((f) => field(f.name, f.label, { type: f.type ?? 'text', value: f.value ?? '' })),
    typed ? field('typed', `Type ${typed} to confirm`, { pattern: typed.replace(/[.*+?^${}()|[\]\\]/g, '\\$&') }) : null,
    field('operator', 'Your name', { value: session.operator, autocomplete: 'username' }),
    field('reason', 'Why'),
    h('div', { class: 'actions' }, cancel, ok));
  dialog.append(form);
  document.body.append(dialog);
  return new Promise((resolve) => {
    let answer = null;
    cancel.addEventListener('click', () => dialog.close());
    form.addEventListener('submit', () => {
      answer = Object.fromEntries(Object.entries(inputs).map(([k, el]) => [k, el.value.trim()]));
      session.operator = answer.operator;
    });
    dialog.addEventListener('close', () => { dialog.remove(); resolve(answer); });
    dialog.showModal();
    (typed ? inputs.typed : (fields.length ? inputs[fields[0].name] : inputs.reason)).focus();
  });
}

/** Runs a change after its confirmation, and says what it did. */
async function act(confirmation, run, done) {
  const who = await confirmChange(confirmation);
  if (!who) return false;
  try {
    const result = await run(who);
    notify(done(result), 'info');
    await render();
    return true;
  } catch (e) {
    showError(e);
    return false;
  }
}

// ----- the stream ----------------------------------------------------------

/** One WebSocket, reconnected with backoff; subscriptions resume from where they stood. */
class Stream {
  constructor() {
    this.subs = new Map();
    this.n = 0;
    this.ws = null;
    this.open = false;
    this.backoff = 500;
    this.stopped = false;
  }

  start() {
    this.stopped = false;
    if (!this.ws) this.connect();
  }

  stop() {
    this.stopped = true;
    const ws = this.ws;
    this.ws = null;
    this.open = false;
    ws?.close();
  }

  connect() {
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    const ws = new WebSocket(`${scheme}://${location.host}/api/v1/stream`);
    this.ws = ws;
    ws.addEventListener('open', () => {
      if (session.token) ws.send(JSON.stringify({ op: 'auth', token: session.token }));
      this.open = true;
      this.backoff = 500;
      live(true);
      for (const sub of this.subs.values()) this.send(sub);
    });
    ws.addEventListener('message', (m) => {
      try { this.dispatch(JSON.parse(m.data)); } catch (e) { showError(e); }
    });
    ws.addEventListener('close', () => {
      if (this.ws !== ws) return;
      this.open = false;
      this.ws = null;
      live(false);
      if (this.stopped) return;
      setTimeout(() => { if (!this.ws && !this.stopped) this.connect(); }, this.backoff);
      this.backoff = Math.min(this.backoff * 2, 10_000);
    });
  }

  /** Subscribes; `onItem` gets each message. Returns the unsubscribe. */
  subscribe(topic, fields, onItem) {
    const sub = { id: `s${++this.n}`, topic, fields: { ...fields }, onItem };
    this.subs.set(sub.id, sub);
    if (this.open) this.send(sub);
    return () => {
      this.subs.delete(sub.id);
      if (this.open) this.ws.send(JSON.stringify({ op: 'unsubscribe', id: sub.id }));
    };
  }

  send(sub) {
    this.ws.send(JSON.stringify({ op: 'subscribe', id: sub.id, topic: sub.topic, ...sub.fields }));
  }

  dispatch(m) {
    const sub = this.subs.get(m.sub ?? m.id);
    switch (m.type) {
      case 'event':
        if (sub) { sub.fields.after = m.event.seq; sub.onItem(m); }
        break;
      case 'dead_letter':
        if (sub) { sub.fields.after = m.dead_letter.id; sub.onItem(m); }
        break;
      case 'run':
        if (sub) { sub.fields.after = m.run.updated_at; sub.onItem(m); }
        break;
      case 'stats':
        sub?.onItem(m);
        break;
      case 'lagged':
        // The server cut a subscription it could not keep up with: take
        // it up again from where it stood.
        if (sub && this.open) { sub.fields.after = m.resume_after; this.send(sub); }
        break;
      case 'error':
        if (m.error.code === 'unauthorized') {
          askForToken(new ApiError(401, 'unauthorized', m.error.message));
        } else {
          notify(`The stream: ${m.error.code}: ${m.error.message}`);
        }
        break;
      default:
        break;
    }
  }
}

const stream = new Stream();

function live(up) {
  const el = $('#live');
  el.textContent = up ? 'live' : 'reconnecting…';
  el.classList.toggle('live', up);
  el.classList.toggle('down', !up);
}

// ----- the chart -----------------------------------------------------------

/**
 * Appends and settled runs per second over the last minute: the lines in an
 * SVG that stretches to any width, the scale beside it in HTML (so its text
 * stays readable on a phone).
 */
function rateChart() {
  const W = 590; // 60 points, 10 apart
  const H = 100;
  const points = [];
  const svg = s('svg', {
    viewBox: `0 0 ${W} ${H}`,
    preserveAspectRatio: 'none',
    role: 'img',
    'aria-labelledby': 'chart-title',
  });
  const title = s('title', { id: 'chart-title' });
  title.textContent = 'Appends and settled runs per second, the last minute';
  svg.append(title);
  for (const y of [0, H / 2, H]) {
    svg.append(s('line', { class: 'grid', x1: 0, x2: W, y1: y, y2: y, 'vector-effect': 'non-scaling-stroke' }));
  }
  const appends = s('polyline', { class: 'appends', 'vector-effect': 'non-scaling-stroke' });
  const settled = s('polyline', { class: 'settled', 'vector-effect': 'non-scaling-stroke' });
  svg.append(appends, settled);
  const scale = [h('span', {}, '1'), h('span', {}, '0.5'), h('span', {}, '0')];
  const now = h('span', { class: 'hint', id: 'rates' }, 'waiting for the first tick…');

  function draw() {
    const max = Math.max(1, ...points.flatMap((p) => [p.appended_per_s ?? 0, p.settled_per_s ?? 0]));
    const top = niceCeil(max);
    const label = (v) => (v < 10 ? String(Math.round(v * 10) / 10) : num(Math.round(v)));
    scale[0].textContent = label(top);
    scale[1].textContent = label(top / 2);
    const start = 60 - points.length;
    const line = (key) => points
      .map((p, i) => `${(start + i) * 10},${H - ((p[key] ?? 0) / top) * H}`)
      .join(' ');
    appends.setAttribute('points', line('appended_per_s'));
    settled.setAttribute('points', line('settled_per_s'));
    const last = points.at(-1);
    now.textContent = `now: ${num(Math.round(last.appended_per_s ?? 0))} appends/s, `
      + `${num(Math.round(last.settled_per_s ?? 0))} settled runs/s`;
  }

  return {
    el: h('figure', { class: 'chart' },
      h('div', { class: 'chart-body' }, h('div', { class: 'scale', 'aria-hidden': 'true' }, scale), svg),
      h('figcaption', { class: 'legend' },
        h('span', { class: 'key-appends' }, 'appends/s'),
        h('span', { class: 'key-settled' }, 'settled runs/s'),
        now)),
    push(rates) {
      if (rates.appended_per_s === null) return;
      points.push(rates);
      if (points.length > 60) points.shift();
      draw();
    },
  };
}

function niceCeil(x) {
  const p = 10 ** Math.floor(Math.log10(x));
  return [1, 2, 5, 10].map((m) => m * p).find((v) => v >= x);
}

// ----- pages ---------------------------------------------------------------

function stateCell(state) {
  return h('span', { class: `state-${state}` }, state);
}

function runLink(id) {
  return id ? h('a', { href: `#/run/${enc(id)}`, class: 'mono' }, id) : '–';
}

function eventLink(workspace, id, label = id) {
  return workspace && id ? h('a', { href: `#/event/${enc(workspace)}/${enc(id)}`, class: 'mono' }, label) : '–';
}

/** The overview: counts, the live chart, consumers, blocked lanes, leases, followers. */
async function overview(main) {
  const [status, lanes, actions] = await Promise.all([
    api('/api/v1/status'), api('/api/v1/lanes'), api('/api/v1/actions'),
  ]);
  const counts = new Map();
  const count = (key, value) => {
    const el = h('span', { data: { count: key } }, num(value));
    counts.set(key, el);
    return el;
  };
  const kinds = [...new Set([...DEAD_LETTER_KINDS, ...Object.keys(status.dead_letters)])];
  const chart = rateChart();
  main.append(
    h('h1', {}, 'Overview'),
    h('section', { class: 'cards', 'aria-label': 'Counts' },
      h('div', { class: 'card' }, h('h3', {}, 'Events appended'), h('div', { class: 'big' }, count('head_seq', status.head_seq))),
      h('div', { class: 'card' }, h('h3', {}, 'Runs by state'),
        h('dl', {}, RUN_STATES.flatMap((st) => [h('dt', {}, st), h('dd', {}, count(`runs.${st}`, status.runs[st] ?? 0))]))),
      h('div', { class: 'card' }, h('h3', {}, 'Open dead letters'),
        h('dl', {}, kinds.flatMap((k) => [h('dt', {}, k), h('dd', {}, count(`dead_letters.${k}`, status.dead_letters[k] ?? 0))]))),
      h('div', { class: 'card' }, h('h3', {}, 'Blocked lanes'), h('div', { class: 'big' }, count('blocked_lanes', status.blocked_lanes))),
      h('div', { class: 'card' }, h('h3', {}, 'Stuck consumers'), h('div', { class: 'big' }, count('stuck', status.stuck.length)))),
    h('h2', {}, 'Rates'),
    chart.el,
    h('h2', {}, 'Workspaces'),
    table('Workspaces', [
      { label: 'name', cell: (w) => h('a', { href: `#/events?ws=${enc(w.name)}` }, w.name) },
      { label: 'event types', cell: (w) => w.event_types.join(', '), class: 'wrap' },
      { label: 'created', cell: (w) => when(w.created_at) },
    ], status.workspaces),
    h('h2', {}, 'Consumers'),
    consumersTable(status.consumers),
    h('h2', {}, 'Blocked lanes'),
    lanesTable(lanes.blocked),
    h('h2', {}, 'Paused'),
    pausedTable(actions.paused),
    h('h2', {}, 'Action priorities and limits'),
    table('Actions', [
      { label: 'action', cell: (c) => c.action },
      { label: 'priority', cell: (c) => String(c.priority), class: 'num' },
      { label: 'max running', cell: (c) => (c.max_running ?? '–'), class: 'num' },
      { label: 'rate', cell: (c) => (c.rate ? `${c.rate[0]} per ${c.rate[1]} ms` : '–') },
      { label: 'per', cell: (c) => c.partition_by ?? '–' },
    ], actions.actions, { empty: 'No action has a priority or limits set.' }),
    h('h2', {}, 'Leases'),
    table('Leases', [
      { label: 'name', cell: (l) => l.name },
      { label: 'holder', cell: (l) => l.holder, class: 'mono' },
      { label: 'generation', cell: (l) => num(l.generation), class: 'num' },
      { label: 'state', cell: (l) => l.state },
      { label: 'expires', cell: (l) => when(l.expires_at) },
      { label: 'renewed', cell: (l) => when(l.renewed_at) },
    ], status.leases),
    h('h2', {}, 'Followers'),
    followersTable(status.followers),
  );
  const update = (stats) => {
    const set = (key, v) => { const el = counts.get(key); if (el) el.textContent = num(v); };
    set('head_seq', stats.events_appended);
    for (const st of RUN_STATES) set(`runs.${st}`, stats.runs[st] ?? 0);
    for (const k of kinds) set(`dead_letters.${k}`, stats.dead_letters[k] ?? 0);
    set('blocked_lanes', stats.blocked_lanes);
  };
  return stream.subscribe('stats', { every_ms: 1000 }, (m) => {
    chart.push(m.rates);
    update(m.stats);
  });
}

function consumersTable(consumers) {
  const columns = [
    { label: 'workspace', cell: (c) => c.workspace },
    { label: 'kind', cell: (c) => c.kind },
    { label: 'name', cell: (c) => c.name },
    { label: 'cursor', cell: (c) => num(c.position), class: 'num' },
    { label: 'lag', cell: (c) => num(c.lag), class: 'num' },
    { label: 'failures', cell: (c) => num(c.failures), class: 'num' },
    { label: 'last error', cell: (c) => c.last_error ?? '', class: 'wrap' },
    { label: 'updated', cell: (c) => when(c.updated_at) },
  ];
  if (canChange()) {
    columns.push({
      label: 'actions',
      cell: (c) => h('button', {
        type: 'button',
        onclick: () => act({
          title: `Reset the cursor of ${c.kind} ${c.name}`,
          text: `It stands at seq ${c.position} of ${c.workspace}. Moving it back makes ${c.name} see those events again; moving it on skips them.`,
          typed: c.name,
          fields: [{ name: 'to', label: 'To seq', type: 'number', value: String(c.position) }],
          action: 'Reset the cursor',
        }, (who) => change('/api/v1/cursors/reset', who, {
          workspace: c.workspace, kind: c.kind, name: c.name, to: Number(who.to),
        }), () => `The cursor of ${c.kind} ${c.name} was reset.`),
      }, 'Reset cursor…'),
    });
  }
  return table('Consumers: cursor and lag when the page opened', columns, consumers, {
    rowClass: (c) => (c.failures >= 3 ? 'bad' : undefined),
    empty: 'No consumers yet.',
  });
}

function pausedTable(paused) {
  const columns = [
    { label: 'kind', cell: (p) => p.kind },
    { label: 'name', cell: (p) => p.name },
    { label: 'since', cell: (p) => when(p.since) },
    { label: 'by', cell: (p) => p.operator },
    { label: 'why', cell: (p) => p.reason, class: 'wrap' },
  ];
  if (canChange()) {
    columns.push({
      label: 'actions',
      cell: (p) => h('button', {
        type: 'button',
        data: { action: 'resume', name: p.name },
        onclick: () => act({
          title: `Resume ${p.kind} ${p.name}`,
          text: 'It goes on from where it stood.',
          action: 'Resume',
        }, (who) => change('/api/v1/resume', who, { kind: p.kind, name: p.name }),
        () => `${p.kind} ${p.name} goes on.`),
      }, 'Resume…'),
    });
  }
  return table('Paused', columns, paused, { empty: 'Nothing is paused.' });
}

function lanesTable(lanes) {
  const columns = [
    { label: 'rule', cell: (l) => l.rule },
    { label: 'scope', cell: (l) => l.scope },
    { label: 'held behind', cell: (l) => runLink(l.run_id) },
    { label: 'error', cell: (l) => l.last_error ?? '', class: 'wrap' },
    { label: 'since', cell: (l) => when(l.since) },
  ];
  if (canChange()) {
    columns.push({
      label: 'actions',
      cell: (l) => h('button', {
        type: 'button',
        onclick: () => act({
          title: `Unblock ${l.rule} / ${l.scope}`,
          text: 'The scope goes on with its next run; the dead run stays dead (retry or discard it on its page).',
          action: 'Unblock',
        }, (who) => change('/api/v1/lanes/unblock', who, { rule: l.rule, scope: l.scope }),
        () => `${l.rule} / ${l.scope} goes on.`),
      }, 'Unblock…'),
    });
  }
  return table('Blocked lanes', columns, lanes, { empty: 'No lane is blocked.' });
}

function followersTable(followers) {
  const columns = [
    { label: 'name', cell: (f) => f.name },
    { label: 'from', cell: (f) => f.source },
    { label: 'to', cell: (f) => `${f.target}${f.target_file ? ` (${f.target_file})` : ''}`, class: 'wrap' },
    { label: 'cursor', cell: (f) => num(f.cursor), class: 'num' },
    { label: 'lag', cell: (f) => num(f.lag), class: 'num' },
    { label: 'published', cell: (f) => num(f.published), class: 'num' },
    { label: 'dead letters', cell: (f) => num(f.dead_letters), class: 'num' },
    { label: 'stops', cell: (f) => num(f.stops), class: 'num' },
    { label: 'last error', cell: (f) => f.last_error ?? '', class: 'wrap' },
  ];
  if (canChange()) {
    columns.push({
      label: 'actions',
      cell: (f) => h('button', {
        type: 'button',
        onclick: () => act({
          title: `Restart follower ${f.name}`,
          text: 'Whichever process runs it goes on from its cursor.',
          action: 'Restart',
        }, (who) => change(`/api/v1/followers/${enc(f.name)}/restart`, who),
        () => `Follower ${f.name} was asked to go on.`),
      }, 'Restart…'),
    });
  }
  return table('Followers', columns, followers, {
    rowClass: (f) => (f.last_error ? 'bad' : undefined),
    empty: 'No followers.',
  });
}

/** A live tail of a workspace: pause, resume, filter; every event opens. */
async function events(main, query) {
  const status = await api('/api/v1/status');
  const names = status.workspaces.map((w) => w.name);
  const ws = query.get('ws') ?? names[0];
  main.append(h('h1', {}, 'Events'));
  if (!ws) {
    main.append(h('p', { class: 'empty' }, 'The file has no workspace yet.'));
    return undefined;
  }
  const types = (query.get('types') ?? '').split(',').map((t) => t.trim()).filter(Boolean);
  const subject = query.get('subject') ?? '';
  const form = h('form', { class: 'filters', role: 'search' },
    h('label', {}, 'Workspace', h('select', { name: 'ws' }, names.map((n) => h('option', { value: n, selected: n === ws }, n)))),
    h('label', {}, 'Types (comma-separated)', h('input', { name: 'types', value: types.join(', '), placeholder: 'all' })),
    h('label', {}, 'Subject', h('input', { name: 'subject', value: subject, placeholder: 'any' })),
    h('button', { type: 'submit', class: 'primary' }, 'Apply'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    q.set('ws', form.ws.value);
    if (form.types.value.trim()) q.set('types', form.types.value.trim());
    if (form.subject.value.trim()) q.set('subject', form.subject.value.trim());
    location.hash = `#/events?${q}`;
  });
  const list = h('ol', { class: 'tail', id: 'tail', 'aria-live': 'polite', 'aria-relevant': 'additions' });
  const shown = h('span', { class: 'hint', id: 'tail-count' }, '');
  const pause = h('button', { type: 'button', id: 'tail-pause', 'aria-pressed': 'false' }, 'Pause');
  main.append(form, h('div', { class: 'toolbar' }, pause, shown), list);

  let last = Math.max(0, status.head_seq - 100);
  let n = 0;
  const onEvent = (m) => {
    const ev = m.event;
    last = ev.seq;
    n += 1;
    list.prepend(eventItem(ev, true));
    while (list.children.length > TAIL_MAX) list.lastChild.remove();
    shown.textContent = `${num(n)} events since the page opened; the newest first; the last seq ${num(last)}`;
  };
  const fields = () => ({ workspace: ws, after: last, types, ...(subject ? { subject } : {}) });
  let unsubscribe = stream.subscribe('events', fields(), onEvent);
  pause.addEventListener('click', () => {
    if (unsubscribe) {
      unsubscribe();
      unsubscribe = null;
      pause.textContent = 'Resume';
      pause.setAttribute('aria-pressed', 'true');
      shown.textContent = `Paused after seq ${num(last)}: resuming takes up from there.`;
    } else {
      unsubscribe = stream.subscribe('events', fields(), onEvent);
      pause.textContent = 'Pause';
      pause.setAttribute('aria-pressed', 'false');
    }
  });
  return () => unsubscribe?.();
}

function eventItem(ev, fresh = false) {
  return h('li', { class: fresh ? 'fresh' : undefined, data: { seq: ev.seq } },
    h('details', {},
      h('summary', {},
        h('span', { class: 'seq' }, `#${ev.seq}`),
        h('span', { class: 'type' }, ev.type),
        h('span', {}, ev.subject),
        h('span', { class: 'when' }, `${ev.actor} · ${when(ev.recorded_at)}`)),
      eventBody(ev)));
}

function eventBody(ev) {
  return [
    kv([
      ['id', eventLink(ev.workspace, ev.id)],
      ['workspace', ev.workspace],
      ['occurred', when(ev.occurred_at)],
      ['recorded', when(ev.recorded_at)],
      ['caused by', ev.causation_id ? eventLink(ev.workspace, ev.causation_id) : '–'],
      ['correlation', ev.correlation_id ? eventLink(ev.workspace, ev.correlation_id) : '–'],
      ['depth', String(ev.depth)],
    ]),
    pre(ev.payload),
  ];
}

/** One event by id; an id that is a run's opens the run. */
async function eventPage(main, query, [workspace, id]) {
  let ev;
  try {
    ev = await api(`/api/v1/workspaces/${enc(workspace)}/events/${enc(id)}`);
  } catch (e) {
    if (e.status !== 404) throw e;
    try {
      await api(`/api/v1/runs/${enc(id)}`);
      location.replace(`#/run/${enc(id)}`);
      return undefined;
    } catch {
      throw e;
    }
  }
  main.append(h('h1', {}, `Event #${ev.seq}: ${ev.type}`), h('p', {}, ev.subject), ...eventBody(ev));
  return undefined;
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
async function runs(main, query) {
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
      RUN_STATES.map((st) => h('option', { value: st, selected: st === filter.state }, st)))),
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
function bulkButton(label, path, filter, what, verb) {
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

/** A run: its fields, input, checkpoint, the event that fired it, what it emitted. */
async function runPage(main, query, [id]) {
  const d = await api(`/api/v1/runs/${enc(id)}`);
  const r = d.run;
  main.append(
    h('h1', {}, `Run ${r.action}`),
    kv([
      ['id', h('span', { class: 'mono' }, r.id)],
      ['state', stateCell(r.state)],
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
      ['created', when(r.created_at)],
      ['updated', when(r.updated_at)],
      ['finished', when(r.finished_at)],
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
  main.append(h('h2', {}, 'Input'), pre(r.input));
  main.append(h('h2', {}, 'Checkpoint'), r.checkpoint === null ? h('p', { class: 'empty' }, 'None saved.') : pre(r.checkpoint));
  main.append(h('h2', {}, 'Fired by'), d.event
    ? h('div', {}, h('p', {}, eventLink(d.event.workspace, d.event.id, `#${d.event.seq} ${d.event.type} (${d.event.subject})`)), pre(d.event.payload))
    : h('p', { class: 'empty' }, 'No event (a delivery or a scheduled job, or the event was pruned).'));
  main.append(h('h2', {}, 'Emitted'), d.emitted.length
    ? h('ul', {}, d.emitted.map((e) => h('li', {}, eventLink(e.workspace, e.id, `#${e.seq} ${e.type} (${e.subject})`))))
    : h('p', { class: 'empty' }, 'Nothing.'));
  return undefined;
}

/** Dead letters by filter; retry or discard one, or all matching; blocked lanes. */
async function deadLetters(main, query) {
  const filter = {};
  for (const k of ['kind', 'consumer', 'workspace', 'reason']) if (query.get(k)) filter[k] = query.get(k);
  const all = query.get('all') === 'true';
  const q = new URLSearchParams(filter);
  if (all) q.set('all', 'true');
  if (query.get('before')) q.set('before', query.get('before'));
  const [page, lanes] = await Promise.all([api(`/api/v1/dead-letters?${q}`), api('/api/v1/lanes')]);
  const input = (name, label) => h('label', {}, label, h('input', { name, value: query.get(name) ?? '' }));
  const form = h('form', { class: 'filters', role: 'search' },
    h('label', {}, 'Kind', h('select', { name: 'kind' },
      h('option', { value: '' }, 'any'),
      DEAD_LETTER_KINDS.map((k) => h('option', { value: k, selected: k === filter.kind }, k)))),
    input('consumer', 'Consumer'),
    input('workspace', 'Workspace'),
    input('reason', 'Reason'),
    h('label', { class: 'inline' }, h('input', { type: 'checkbox', name: 'all', value: 'true', checked: all }), 'resolved ones too'),
    h('button', { type: 'submit', class: 'primary' }, 'Search'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const next = new URLSearchParams();
    for (const el of form.elements) {
      if (!el.name) continue;
      if (el.type === 'checkbox') { if (el.checked) next.set(el.name, 'true'); } else if (el.value.trim()) next.set(el.name, el.value.trim());
    }
    location.hash = `#/dead-letters?${next}`;
  });
  main.append(h('h1', {}, 'Dead letters'), form);
  if (canChange()) {
    main.append(h('div', { class: 'toolbar' },
      bulkButton('Retry all matching…', '/api/v1/dead-letters/retry', filter, 'open dead letters', 'retry'),
      bulkButton('Discard all matching…', '/api/v1/dead-letters/discard', filter, 'open dead letters', 'discard')));
  }
  const columns = [
    { label: 'id', cell: (d) => String(d.id), class: 'num' },
    { label: 'kind', cell: (d) => d.kind },
    { label: 'consumer', cell: (d) => d.consumer },
    { label: 'event', cell: (d) => (d.event_id ? eventLink(d.workspace, d.event_id, `#${d.event_seq}`) : '–') },
    { label: 'run', cell: (d) => runLink(d.run_id) },
    { label: 'reason', cell: (d) => d.reason },
    { label: 'error', cell: (d) => d.error, class: 'wrap' },
    { label: 'attempts', cell: (d) => num(d.attempts), class: 'num' },
    { label: 'when', cell: (d) => when(d.created_at) },
    { label: 'resolved', cell: (d) => (d.resolution ? `${d.resolution} ${when(d.resolved_at)}` : 'open') },
  ];
  if (canChange()) {
    columns.push({
      label: 'actions',
      cell: (d) => (d.resolution ? '' : h('div', { class: 'row-actions' },
        h('button', {
          type: 'button',
          data: { action: 'retry', id: d.id },
          onclick: () => act({ title: `Retry dead letter ${d.id}`, text: `${d.consumer}: ${d.error}`, action: 'Retry' },
            (who) => change(`/api/v1/dead-letters/${d.id}/retry`, who), () => `Dead letter ${d.id} was retried.`),
        }, 'Retry…'),
        h('button', {
          type: 'button',
          data: { action: 'discard', id: d.id },
          onclick: () => act({ title: `Discard dead letter ${d.id}`, text: `${d.consumer}: ${d.error}`, action: 'Discard' },
            (who) => change(`/api/v1/dead-letters/${d.id}/discard`, who), () => `Dead letter ${d.id} was discarded.`),
        }, 'Discard…'))),
    });
  }
  main.append(table('Dead letters, newest first', columns, page.dead_letters, { empty: 'No dead letter matches.' }));
  if (page.next !== null) {
    const older = new URLSearchParams(query);
    older.set('before', page.next);
    main.append(h('p', {}, h('a', { href: `#/dead-letters?${older}` }, 'Older dead letters')));
  }
  main.append(h('h2', {}, 'Blocked lanes'), lanesTable(lanes.blocked));
  return undefined;
}

async function rules(main) {
  const list = await api('/api/v1/rules');
  main.append(h('h1', {}, 'Rules'), table('Rules', [
    { label: 'name', cell: (r) => r.name },
    { label: 'workspace', cell: (r) => r.workspace },
    { label: 'version', cell: (r) => num(r.version), class: 'num' },
    { label: 'cursor', cell: (r) => num(r.cursor), class: 'num' },
    { label: 'lag', cell: (r) => num(r.lag), class: 'num' },
    { label: 'here', cell: (r) => (r.registered_here ? 'registered in this process' : '–') },
    { label: 'runs', cell: (r) => h('a', { href: `#/runs?rule=${enc(r.name)}` }, 'its runs') },
    { label: 'definition', cell: (r) => h('details', {}, h('summary', {}, 'show'), pre(r.definition)), class: 'wrap' },
    { label: 'updated', cell: (r) => when(r.updated_at) },
  ], list, { empty: 'No rules registered in this file.' }));
  return undefined;
}

async function reactions(main) {
  const list = await api('/api/v1/reactions');
  main.append(h('h1', {}, 'Reactions'), consumersTable(list));
  return undefined;
}

async function followers(main) {
  main.append(h('h1', {}, 'Followers'), followersTable(await api('/api/v1/followers')));
  return undefined;
}

async function schedules(main) {
  const list = await api('/api/v1/schedules');
  main.append(h('h1', {}, 'Schedules'), table('Schedules', [
    { label: 'name', cell: (j) => j.name },
    { label: 'when', cell: (j) => j.spec, class: 'mono' },
    { label: 'guarantee', cell: (j) => j.guarantee },
    { label: 'missed', cell: (j) => j.missed },
    { label: 'next due', cell: (j) => when(j.next_due_at) },
    { label: 'last due', cell: (j) => when(j.last_due_at) },
  ], list, { empty: 'No scheduled jobs.' }));
  return undefined;
}

async function audit(main) {
  const list = await api('/api/v1/audit?limit=200');
  main.append(h('h1', {}, 'Audit log'), table('What operators did, newest first', [
    { label: 'when', cell: (a) => when(a.at) },
    { label: 'operator', cell: (a) => a.operator },
    { label: 'action', cell: (a) => a.action },
    { label: 'target', cell: (a) => a.target, class: 'wrap mono' },
    { label: 'reason', cell: (a) => a.reason, class: 'wrap' },
    { label: 'detail', cell: (a) => a.detail, class: 'wrap' },
  ], list, { empty: 'Nothing yet.' }));
  return undefined;
}

// ----- routing -------------------------------------------------------------

const ROUTES = [
  [/^\/overview$/, overview, 'Overview'],
  [/^\/events$/, events, 'Events'],
  [/^\/event\/([^/]+)\/(.+)$/, eventPage, 'Event'],
  [/^\/runs$/, runs, 'Runs'],
  [/^\/run\/(.+)$/, runPage, 'Run'],
  [/^\/dead-letters$/, deadLetters, 'Dead letters'],
  [/^\/rules$/, rules, 'Rules'],
  [/^\/reactions$/, reactions, 'Reactions'],
  [/^\/followers$/, followers, 'Followers'],
  [/^\/schedules$/, schedules, 'Schedules'],
  [/^\/audit$/, audit, 'Audit'],
];

let cleanup = null;
let rendering = 0;

async function render() {
  const turn = ++rendering;
  cleanup?.();
  cleanup = null;
  const [path, search = ''] = (location.hash.slice(1) || '/overview').split('?');
  const found = ROUTES.map(([re, page, title]) => [path.match(re), page, title]).find(([m]) => m);
  const main = $('#main');
  const fresh = h('div', { class: 'page' });
  for (const a of document.querySelectorAll('nav a')) {
    const current = a.getAttribute('href') === `#${path}`;
    if (current) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  if (!found) {
    main.replaceChildren(h('h1', {}, 'Not found'), h('p', {}, h('a', { href: '#/overview' }, 'The overview')));
    return;
  }
  const [match, page, title] = found;
  document.title = `${title} · reflexr`;
  try {
    const stop = await page(fresh, new URLSearchParams(search), match.slice(1).map(decodeURIComponent));
    if (turn !== rendering) { stop?.(); return; }
    cleanup = stop ?? null;
    main.replaceChildren(fresh);
  } catch (e) {
    if (turn !== rendering) return;
    if (!(e instanceof ApiError && e.status === 401)) showError(e);
    main.replaceChildren(h('h1', {}, title), h('p', { class: 'empty', id: 'page-error' }, describe(e)));
  }
}

/** Learns what the server allows, then shows the page. */
async function boot() {
  let status;
  try {
    status = await api('/api/v1/status');
  } catch (e) {
    if (!(e instanceof ApiError && e.status === 401)) {
      showError(e);
      $('#main').replaceChildren(h('h1', {}, 'reflexr'), h('p', { class: 'empty' }, describe(e)));
    }
    return;
  }
  session.readOnly = Boolean(status.read_only);
  document.body.classList.toggle('read-only', session.readOnly);
  $('#mode').hidden = !session.readOnly;
  $('#forget').hidden = !session.token;
  stream.stop();
  stream.start();
  await render();
}

window.addEventListener('hashchange', () => {
  render().then(() => $('#main').focus({ preventScroll: true }));
});
$('#notice-close').addEventListener('click', () => { $('#notice').hidden = true; });
$('#forget').addEventListener('click', () => {
  session.token = '';
  stream.stop();
  location.reload();
});
$('#login-form').addEventListener('submit', () => {
  const go = signingIn;
  signingIn = null;
  go?.();
});

boot();
