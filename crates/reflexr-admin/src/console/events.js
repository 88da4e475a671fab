// Events: a workspace's live tail, and one event's page.

import { api } from './api.js';
import { enc, h, kv, num, pre, when } from './dom.js';
import { stream } from './stream.js';

/** How many events the tail keeps on the page: the oldest go. */
const TAIL_MAX = 500;

export function eventLink(workspace, id, label = id) {
  return workspace && id ? h('a', { href: `#/event/${enc(workspace)}/${enc(id)}`, class: 'mono' }, label) : '–';
}

/** A live tail of a workspace: pause, resume, filter; every event opens. */
export async function events(main, query) {
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
export async function eventPage(main, query, [workspace, id]) {
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
