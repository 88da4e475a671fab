// Small helpers every page uses: elements built with DOM calls and
// textContent (so nothing the file holds is ever parsed as HTML), times,
// numbers, tables.

export const $ = (sel, root = document) => root.querySelector(sel);

/** An element: `h('a', {href: '#/x'}, 'text', child)`. */
export function h(tag, attrs = {}, ...children) {
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

/** An SVG element (the chart's), which `h` cannot make. */
export function s(tag, attrs = {}) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

/** A time in ms since the epoch, as UTC with milliseconds. */
export function when(ms) {
  if (ms === null || ms === undefined || ms === 0) return '–';
  const d = new Date(ms);
  return Number.isNaN(d.getTime()) ? String(ms) : d.toISOString().replace('T', ' ');
}

export const num = (n) => (n ?? 0).toLocaleString('en');
export const json = (v) => JSON.stringify(v, null, 2);
export const enc = encodeURIComponent;

export function table(caption, columns, rows, opts = {}) {
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

export function kv(pairs) {
  return h('dl', { class: 'kv' }, pairs.filter(Boolean).flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

export function pre(value) {
  return h('pre', { class: 'json' }, typeof value === 'string' ? value : json(value));
}
