// The reflexr console: ES modules, no dependencies, no build step. This
// one is the entry: it routes the URL's hash to a page and boots.
//
// It reads the REST routes under /api/v1 and follows the WebSocket stream
// at /api/v1/stream, like any other client. The token, when the server
// wants one, is typed in once, kept in this tab's sessionStorage and sent
// as a header (and as the stream's first message): never in a URL.
// Everything shown is built with DOM calls and textContent, so nothing the
// file holds is ever parsed as HTML.
//
// The modules, each imported by path from /console/: dom.js (helpers),
// session.js (token, operator, notices), api.js (the routes and the
// server's enum lists), dialogs.js, stream.js, chart.js, and one per page.
// The pages import those, app.js imports the pages; nothing imports app.js.

import { api, ApiError, loadVocabulary } from './api.js';
import { audit } from './audit.js';
import { deadLetters } from './dead_letters.js';
import { setRedraw, signIn } from './dialogs.js';
import { $, h } from './dom.js';
import { eventPage, events } from './events.js';
import { followers } from './followers.js';
import { overview } from './overview.js';
import { reactions } from './reactions.js';
import { rules } from './rules.js';
import { runPage, runs } from './runs.js';
import { schedules } from './schedules.js';
import { describe, session, showError } from './session.js';
import { stream } from './stream.js';

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

/** Learns what the server allows and the names it uses, then shows the page. */
async function boot() {
  let status;
  try {
    status = await api('/api/v1/status');
    await loadVocabulary();
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
  if (signIn()) boot();
});
setRedraw(render);

boot();
