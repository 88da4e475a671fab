// The overview: what the file holds at a glance, the counts kept live by
// the stream's stats.

import { api, change, vocabulary } from './api.js';
import { rateChart } from './chart.js';
import { lanesTable } from './dead_letters.js';
import { act } from './dialogs.js';
import { enc, h, num, table, when } from './dom.js';
import { followersTable } from './followers.js';
import { consumersTable } from './reactions.js';
import { canChange } from './session.js';
import { stream } from './stream.js';

/** The overview: counts, the live chart, consumers, blocked lanes, limits and keys, leases, followers. */
export async function overview(main) {
  const [status, lanes, actions] = await Promise.all([
    api('/api/v1/status'), api('/api/v1/lanes'), api('/api/v1/actions'),
  ]);
  // A keyed action's keys, each read on its own: one that fails is said in
  // its place rather than failing the page.
  const keyed = await Promise.all(actions.actions.filter((c) => c.fair || c.partition_by)
    .map((c) => api(`/api/v1/actions/${enc(c.action)}/keys`).then(
      (k) => ({ action: c.action, keys: k.keys }),
      (e) => ({ action: c.action, error: e.message }))));
  const counts = new Map();
  const count = (key, value) => {
    const el = h('span', { data: { count: key } }, num(value));
    counts.set(key, el);
    return el;
  };
  const kinds = [...new Set([...vocabulary.deadLetterKinds, ...Object.keys(status.dead_letters)])];
  const chart = rateChart();
  main.append(
    h('h1', {}, 'Overview'),
    h('section', { class: 'cards', 'aria-label': 'Counts' },
      h('div', { class: 'card' }, h('h3', {}, 'Events appended'), h('div', { class: 'big' }, count('head_seq', status.head_seq))),
      h('div', { class: 'card' }, h('h3', {}, 'Runs by state'),
        h('dl', {}, vocabulary.runStates.flatMap((st) => [h('dt', {}, st), h('dd', {}, count(`runs.${st}`, status.runs[st] ?? 0))]))),
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
      { label: 'rate', cell: (c) => rate(c.rate) },
      { label: 'per', cell: (c) => c.partition_by ?? '–' },
      { label: 'fair', cell: (c) => (c.fair ? 'yes' : 'no') },
    ], actions.actions, { empty: 'No action has a priority or limits set.' }),
    ...keyed.map(keysTable),
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
    for (const st of vocabulary.runStates) set(`runs.${st}`, stats.runs[st] ?? 0);
    for (const k of kinds) set(`dead_letters.${k}`, stats.dead_letters[k] ?? 0);
    set('blocked_lanes', stats.blocked_lanes);
  };
  return stream.subscribe('stats', { every_ms: 1000 }, (m) => {
    chart.push(m.rates);
    update(m.stats);
  });
}

const rate = (r) => (r ? `${r[0]} per ${r[1]} ms` : '–');

/** One keyed action's keys: backlog, running, the limits that hold, weight. */
function keysTable({ action, keys, error }) {
  const caption = `Keys of ${action}`;
  if (error) return h('p', { class: 'empty' }, `${caption}: ${error}`);
  return table(caption, [
    { label: 'key', cell: (k) => (k.key === '' ? '""' : k.key), class: 'mono' },
    { label: 'backlog', cell: (k) => num(k.waiting + k.ready), class: 'num' },
    { label: 'running', cell: (k) => num(k.running), class: 'num' },
    { label: 'max running', cell: (k) => (k.max_running ?? '–'), class: 'num' },
    { label: 'rate', cell: (k) => rate(k.rate) },
    { label: 'weight', cell: (k) => num(k.weight), class: 'num' },
    { label: 'overridden', cell: (k) => (k.overridden ? 'yes' : 'no') },
  ], keys, { empty: `${caption}: none has unfinished runs or limits of its own.` });
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
