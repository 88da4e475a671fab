// The web console in a real browser (headless Debian chromium), against
// `reflexr <DB> serve` on a file the events-app example leaves: what the
// page shows is what the API says, what it does lands in the file, and its
// security holds (read-only, tokens). Screenshots go to artifacts/.

import assert from 'node:assert/strict';
import { join } from 'node:path';
import { test } from 'node:test';

import { api, artifacts, cli, launch, makeBookingsDb, makeDb, serve } from './harness.mjs';

/** A file with four dead push deliveries (the demo's and three more). */
const demo = () => makeDb(['--expired-tablets', '3']);

/** A server and a browser on it, both stopped when the test ends. */
async function open(t, db, { args = [], env = {}, viewport = { width: 1280, height: 800 } } = {}) {
  const server = await serve(db, args, env);
  t.after(() => server.stop());
  const browser = await launch({ viewport });
  t.after(() => browser.close());
  return { server, page: browser.page, browser };
}

/** The page's errors, but for the refusals a test asked for. */
function unexpected(page, allowed = []) {
  return page.errors.filter((e) => !allowed.some((a) => e.includes(a)));
}

/** Answers the open confirmation dialog with a name and a reason. */
async function confirm(page, reason) {
  const dialog = page.locator('dialog.confirm[open]');
  await dialog.waitFor();
  await dialog.locator('input[name="operator"]').fill('browser-test');
  await dialog.locator('input[name="reason"]').fill(reason);
  await dialog.locator('#confirm-ok').click();
  await dialog.waitFor({ state: 'detached' });
}

async function runs(db) {
  const r = await cli(db, ['runs', '--json', '--limit', '1000']);
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout);
}

async function deadLetters(db) {
  const r = await cli(db, ['dead-letters', '--all', '--json']);
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout);
}

test('the overview shows the counts the API gives, at desktop and phone widths', async (t) => {
  const db = await demo();
  const { server, page, browser } = await open(t, db);
  await page.goto(`${server.url}/`);
  await page.locator('[data-count="head_seq"]').waitFor();
  const { json: status } = await api(server.url, '/api/v1/status');
  const shown = await page.$$eval('[data-count]', (els) => els.map((e) => [e.dataset.count, e.textContent]));
  assert.ok(shown.length >= 14, `counts shown: ${JSON.stringify(shown)}`);
  const expected = (key) => {
    const [a, b] = key.split('.');
    if (key === 'stuck') return status.stuck.length;
    return b === undefined ? status[a] : (status[a][b] ?? 0);
  };
  for (const [key, text] of shown) {
    assert.equal(Number(text.replaceAll(',', '')), expected(key), `${key}: the page says ${text}`);
  }
  assert.equal(expected('runs.dead'), 4, 'the fixture has four dead runs');
  assert.equal(expected('dead_letters.run'), 4);
  // Live: appends by another process move the chart and the counts.
  for (let i = 0; i < 5; i += 1) {
    const r = await cli(db, ['append', '-w', 'events-app', '-t', 'session.changed', '--subject', `session/${i}`]);
    assert.equal(r.code, 0, r.stderr);
  }
  await page.locator('#rates').filter({ hasText: /now: [1-9]/ }).waitFor();
  await page.locator('[data-count="head_seq"]').filter({ hasText: /^7$/ }).waitFor();
  await page.waitForFunction(() => document.querySelector('.chart polyline.appends')
    .getAttribute('points').split(' ').length >= 3);
  await page.screenshot({ path: join(artifacts, 'console-overview-1280x800.png') });
  await page.setViewportSize({ width: 390, height: 844 });
  await page.screenshot({ path: join(artifacts, 'console-overview-390x844.png') });
  // Nothing spills sideways on a phone but the tables' own scrolling.
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than the phone`);
  assert.deepEqual(unexpected(page), []);
  await browser.close();
});

test('an event appended by another process appears in the live tail within a second', async (t) => {
  const db = await demo();
  const { server, page } = await open(t, db);
  await page.goto(`${server.url}/#/events?ws=events-app`);
  await page.locator('#tail li[data-seq="2"]').waitFor();
  const appended = await cli(db, [
    'append', '-w', 'events-app', '-t', 'session.changed', '--subject', 'session/9',
    '--payload', '{"id":9,"after":{"room":"Annex"}}', '--json',
  ]);
  assert.equal(appended.code, 0, appended.stderr);
  const { seq } = JSON.parse(appended.stdout);
  // The bound: committed in one process, on the page within 1 s.
  const item = page.locator(`#tail li[data-seq="${seq}"]`);
  await item.waitFor({ timeout: 1_000 });
  await item.locator('summary').click();
  assert.match(await item.locator('pre.json').innerText(), /"room": "Annex"/);
  // Paused, it takes nothing; resumed, it takes up after the last seq
  // shown, without a gap.
  await page.locator('#tail-pause').click();
  await page.locator('#tail-count').filter({ hasText: `Paused after seq ${seq}` }).waitFor();
  const more = await cli(db, ['append', '-w', 'events-app', '-t', 'session.deleted', '--subject', 'session/9', '--json']);
  const next = JSON.parse(more.stdout).seq;
  await page.locator('#tail-pause').click();
  await page.locator(`#tail li[data-seq="${next}"]`).waitFor();
  const seqs = await page.$$eval('#tail li', (els) => els.map((e) => Number(e.dataset.seq)));
  assert.deepEqual(seqs, [next, seq, 2, 1]);
  assert.deepEqual(unexpected(page), []);
});

test('retrying a dead letter from the page changes its run in the file', async (t) => {
  const db = await demo();
  const { server, page } = await open(t, db);
  const before = (await deadLetters(db)).find((d) => d.id === 1);
  assert.equal(before.resolution, null);
  assert.equal((await runs(db)).find((r) => r.id === before.run_id).state, 'dead');
  await page.goto(`${server.url}/#/dead-letters`);
  await page.locator('button[data-action="retry"][data-id="1"]').click();
  await confirm(page, 'push token renewed');
  await page.locator('#notice-text').filter({ hasText: 'Dead letter 1 was retried.' }).waitFor();
  const after = (await deadLetters(db)).find((d) => d.id === 1);
  assert.equal(after.resolution, 'retried');
  const run = (await runs(db)).find((r) => r.id === before.run_id);
  assert.notEqual(run.state, 'dead', 'the run has a fresh set of attempts');
  assert.equal(run.state, 'ready');
  // Recorded with who and why.
  const { json: log } = await api(server.url, '/api/v1/audit');
  assert.equal(log[0].operator, 'browser-test');
  assert.equal(log[0].reason, 'push token renewed');
  assert.deepEqual(unexpected(page), []);
});

test('"retry all matching" states the count and retries exactly those', async (t) => {
  const db = await demo();
  const { server, page } = await open(t, db);
  // One of the four is discarded first: the filter (open ones) must leave it.
  const discarded = await api(server.url, '/api/v1/dead-letters/1/discard', {
    body: { operator: 'setup', reason: 'not this one' },
  });
  assert.equal(discarded.status, 200);
  await page.goto(`${server.url}/#/dead-letters?consumer=delivery%2Fpush`);
  await page.getByRole('button', { name: 'Retry all matching…' }).click();
  const dialog = page.locator('dialog.confirm[open]');
  await dialog.waitFor();
  assert.equal(await dialog.locator('h2').innerText(), 'Retry 3 open dead letters?');
  const listed = (await dialog.locator('li').allInnerTexts()).map(Number).sort();
  assert.deepEqual(listed, [2, 3, 4]);
  await confirm(page, 'all tokens renewed');
  await page.locator('#notice-text').filter({ hasText: 'Retried 3.' }).waitFor();
  const letters = await deadLetters(db);
  const state = Object.fromEntries(letters.map((d) => [d.id, d.resolution]));
  assert.deepEqual(state, { 1: 'discarded', 2: 'retried', 3: 'retried', 4: 'retried' });
  const byId = Object.fromEntries((await runs(db)).map((r) => [r.id, r.state]));
  for (const d of letters) {
    assert.equal(byId[d.run_id], d.id === 1 ? 'discarded' : 'ready', `dead letter ${d.id}'s run`);
  }
  assert.deepEqual(unexpected(page), []);
});

test('read-only mode shows no control that changes anything, and the API refuses a forged one', async (t) => {
  const db = await demo();
  const { server, page } = await open(t, db, { args: ['--read-only'] });
  await page.goto(`${server.url}/#/dead-letters`);
  await page.locator('table caption').filter({ hasText: 'Dead letters' }).waitFor();
  assert.equal(await page.locator('#mode').isVisible(), true, 'the page says read-only');
  assert.equal(await page.getByRole('button', { name: /retry|discard|unblock/i }).count(), 0);
  await page.goto(`${server.url}/#/overview`);
  await page.locator('[data-count="head_seq"]').waitFor();
  assert.equal(await page.getByRole('button', { name: /reset|restart/i }).count(), 0);
  const forged = await page.evaluate(async () => {
    const r = await fetch('/api/v1/dead-letters/1/retry', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ operator: 'mallory', reason: 'forged' }),
    });
    return { status: r.status, body: await r.json() };
  });
  assert.equal(forged.status, 403);
  assert.equal(forged.body.error.code, 'read_only');
  assert.equal((await deadLetters(db)).find((d) => d.id === 1).resolution, null, 'nothing changed');
  assert.deepEqual(unexpected(page, ['403']), []);
});

test('a wrong token gets a clear message; the right one opens the console', async (t) => {
  const db = await demo();
  const token = 'correct-horse-battery-staple';
  const { server, page } = await open(t, db, { env: { REFLEXR_ADMIN_TOKEN: token } });
  await page.goto(`${server.url}/`);
  const login = page.locator('dialog#login[open]');
  await login.waitFor();
  assert.match(await login.locator('#login-why').innerText(), /asks for a token/);
  await login.locator('input[name="token"]').fill('not-the-token-at-all');
  await login.locator('input[name="operator"]').fill('browser-test');
  await login.locator('button[type="submit"]').click();
  await page.locator('#notice-text').filter({ hasText: 'The token was refused' }).waitFor();
  await login.waitFor();
  assert.match(await login.locator('#login-why').innerText(), /refused .*wrong/);
  await page.screenshot({ path: join(artifacts, 'console-wrong-token.png') });
  await login.locator('input[name="token"]').fill(token);
  await login.locator('button[type="submit"]').click();
  await page.locator('[data-count="head_seq"]').waitFor();
  await page.locator('#live.live').waitFor();
  assert.ok(!page.url().includes(token), 'the token is never in a URL');
  const kept = await page.evaluate(() => sessionStorage.getItem('reflexr.token'));
  assert.equal(kept, token);
  assert.deepEqual(unexpected(page, ['401']), []);
});

test('the console is served with its security headers and revalidated by ETag', async (t) => {
  const db = await demo();
  const server = await serve(db);
  t.after(() => server.stop());
  const first = await fetch(`${server.url}/`);
  assert.equal(first.status, 200);
  assert.match(first.headers.get('content-type'), /^text\/html/);
  assert.match(first.headers.get('content-security-policy'), /script-src 'self'/);
  assert.doesNotMatch(first.headers.get('content-security-policy'), /unsafe-inline/);
  assert.equal(first.headers.get('cache-control'), 'no-cache');
  const etag = first.headers.get('etag');
  const again = await fetch(`${server.url}/`, { headers: { 'If-None-Match': etag } });
  assert.equal(again.status, 304);
  const head = await fetch(`${server.url}/`, { method: 'HEAD' });
  assert.equal(head.status, 200);
  assert.equal(head.headers.get('content-length'), first.headers.get('content-length'));
  assert.equal((await head.arrayBuffer()).byteLength, 0, 'a HEAD has no body');
  const js = await fetch(`${server.url}/console/app.js`);
  assert.match(js.headers.get('content-type'), /^text\/javascript/);
  assert.equal((await fetch(`${server.url}/console/nope.js`)).status, 404);
});

test('a pending run is cancelled from its page, and a pause is resumed from the overview', async (t) => {
  const db = await demo();
  const { server, page } = await open(t, db);
  const enq = await cli(db, ['enqueue', 'send-invoice', '--input', '{"invoice":42}', '--in', '1h', '--json']);
  assert.equal(enq.code, 0, enq.stderr);
  const { id } = JSON.parse(enq.stdout);
  await page.goto(`${server.url}/#/run/${id}`);
  await page.locator('#cancel-run').click();
  await confirm(page, 'customer withdrew');
  await page.locator('#notice-text').filter({ hasText: 'The run was cancelled.' }).waitFor();
  assert.equal((await runs(db)).find((r) => r.id === id).state, 'cancelled');

  const paused = await cli(db, ['pause', 'channel', 'push', '--reason', 'provider down']);
  assert.equal(paused.code, 0, paused.stderr);
  await page.goto(`${server.url}/#/overview`);
  await page.locator('button[data-action="resume"][data-name="delivery/push"]').click();
  await confirm(page, 'provider back');
  await page.locator('#notice-text').filter({ hasText: 'goes on' }).waitFor();
  const { json: actions } = await api(server.url, '/api/v1/actions');
  assert.deepEqual(actions.paused, []);
  assert.deepEqual(unexpected(page), []);
});

test('a workflow run shows its timeline, and a reset to a step makes it and those after run again', async (t) => {
  const { db, done, waiting } = await makeBookingsDb();
  const { server, page } = await open(t, db);
  // The suspended run: its steps as the API gives them, the wait in words.
  await page.goto(`${server.url}/#/run/${waiting}`);
  const rows = page.locator('#timeline tbody tr');
  await rows.first().waitFor();
  const { json: steps } = await api(server.url, `/api/v1/runs/${waiting}/steps`);
  const shown = await rows.evaluateAll((trs) => trs.map((tr) => [...tr.cells].map((td) => td.textContent)));
  assert.deepEqual(shown.map((cells) => cells.slice(1, 4)), steps.map((s) => [s.name, s.kind, s.state]));
  const wait = shown[2];
  assert.match(wait[7], /^speaker\.confirmed in talks about session\/2, until \d{4}-/);
  assert.notEqual(wait[8], '–', 'when it wakes');
  await page.screenshot({ path: join(artifacts, 'console-run-timeline-1280x800.png') });

  // The run that ended: no reset of where it began; the reset warns, asks
  // for the step's name, and forgets the step.
  await page.goto(`${server.url}/#/run/${done}`);
  await page.locator('#timeline tbody tr').nth(3).waitFor();
  assert.equal(await page.locator('#timeline tbody tr').first().locator('button').count(), 0);
  await page.locator('button[data-action="reset"][data-step="mail"]').click();
  const dialog = page.locator('dialog.confirm[open]');
  await dialog.waitFor();
  assert.match(await dialog.locator('#confirm-text').innerText(), /may happen again/);
  await dialog.locator('input[name="typed"]').fill('mail');
  await confirm(page, 'the mail bounced');
  await page.locator('#notice-text').filter({ hasText: 'reset to step mail' }).waitFor();
  const { json: after } = await api(server.url, `/api/v1/runs/${done}`);
  assert.equal(after.run.state, 'ready');
  assert.deepEqual(after.steps.map((s) => s.name), ['begin', 'reserve', 'confirmed']);
  await page.locator('#timeline tbody tr').nth(2).waitFor();
  assert.equal(await page.locator('#timeline tbody tr').count(), 3, 'the page was drawn again');
  const { json: log } = await api(server.url, '/api/v1/audit');
  assert.equal(log[0].action, 'reset_run_to_step');
  assert.equal(log[0].operator, 'browser-test');
  assert.equal(log[0].reason, 'the mail bounced');
  assert.deepEqual(unexpected(page), []);
});

test("a run's page shows its progress and the lines it logged", async (t) => {
  const { db, logged, waiting } = await makeBookingsDb();
  const { server, page } = await open(t, db);
  await page.goto(`${server.url}/#/run/${logged}`);
  const rows = page.locator('#run-logs tbody tr');
  await rows.nth(1).waitFor();
  const { json: got } = await api(server.url, `/api/v1/runs/${logged}/logs`);
  const shown = await rows.evaluateAll((trs) => trs.map((tr) => [...tr.cells].map((td) => td.textContent)));
  assert.deepEqual(shown.map((cells) => cells.slice(1, 5)), got.logs.map((l) => [
    String(l.attempt), l.level, l.message, l.fields === null ? '' : JSON.stringify(l.fields),
  ]));
  assert.deepEqual(shown.map((cells) => cells[3]), ['fetched the file', 'row 4 is odd']);
  assert.match(shown[0][0], /^\d{4}-/);
  const bar = page.locator('#run-progress progress');
  assert.equal(await bar.getAttribute('value'), '3');
  assert.equal(await bar.getAttribute('max'), '4');
  assert.match(await page.locator('#run-progress').innerText(), /3 \/ 4 \(attempt 1, /);
  // The trace context it carries, to find its trace by.
  assert.equal(await page.locator('#run-trace').innerText(),
    '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01');
  await page.screenshot({ path: join(artifacts, 'console-run-log-1280x800.png') });
  // A run that logged nothing says so.
  await page.goto(`${server.url}/#/run/${waiting}`);
  await page.locator('#run-logs-empty').waitFor();
  assert.match(await page.locator('#run-progress').innerText(), /not said how far/);
  assert.deepEqual(unexpected(page), []);
});
