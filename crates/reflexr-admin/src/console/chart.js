// The overview's rate chart, fed by the stream's stats.

import { h, num, s } from './dom.js';

/**
 * Appends and settled runs per second over the last minute: the lines in an
 * SVG that stretches to any width, the scale beside it in HTML (so its text
 * stays readable on a phone).
 */
export function rateChart() {
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

/** The scale's top: 1, 2 or 5 times a power of ten, at least `x`. */
function niceCeil(x) {
  const p = 10 ** Math.floor(Math.log10(x));
  return [1, 2, 5, 10].map((m) => m * p).find((v) => v >= x);
}
