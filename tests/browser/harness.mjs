// Helpers for the real-browser tests of the admin web console (`node:test`).
//
//   const db = await makeDb();                 // a demo database (events_app example)
//   const { db, done, waiting } = await makeBookingsDb();   // a workflow's runs (testkit's bookings)
//   const server = await serve(db);            // `reflexr <db> serve --listen 127.0.0.1:0`
//   t.after(() => server.stop());              // SIGTERM, and it must exit 0
//   const browser = await launch();            // headless Debian chromium, fresh profile
//   t.after(() => browser.close());
//   await browser.page.goto(server.url);
//   ...
//   assert.deepEqual(browser.page.errors, []); // console errors and uncaught page errors
//
// Register every cleanup with `t.after` (or try/finally): a server or browser
// left open keeps the test file's process alive. Servers left running when
// the process exits are killed, and the temp directories removed (keep them
// with REFLEXR_KEEP_TMP=1).
//
// Environment: REFLEXR_BIN, EVENTS_APP_BIN, BOOKINGS_BIN (the binaries; default
// target/debug/… of this repository, or of CARGO_TARGET_DIR), CHROMIUM_BIN
// (default /usr/bin/chromium).

import { spawn } from 'node:child_process';
import { mkdirSync, rmSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));

/** The repository's root directory. */
export const repoRoot = resolve(here, '..', '..');

const targetDir = process.env.CARGO_TARGET_DIR
  ? resolve(repoRoot, process.env.CARGO_TARGET_DIR)
  : join(repoRoot, 'target');

/** The `reflexr` CLI under test. */
export const reflexrBin = process.env.REFLEXR_BIN || join(targetDir, 'debug', 'reflexr');

/** The `events_app` example, which writes a demo database. */
export const eventsAppBin =
  process.env.EVENTS_APP_BIN || join(targetDir, 'debug', 'examples', 'events_app');

/** The testkit's `bookings`, which writes a file with a workflow's runs. */
export const bookingsBin = process.env.BOOKINGS_BIN || join(targetDir, 'debug', 'bookings');

/** The browser: Debian's chromium (Playwright's own download is not used). */
export const chromiumBin = process.env.CHROMIUM_BIN || '/usr/bin/chromium';

/** The arguments chromium needs here (headless, in a container, offline). */
export const chromiumArgs = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
];

/** Where tests put screenshots and other evidence: tests/browser/artifacts/. */
export const artifacts = join(here, 'artifacts');
mkdirSync(artifacts, { recursive: true });

// ----- cleanup at exit --------------------------------------------------------

const tempDirs = new Set();
const liveServers = new Set();

process.on('exit', () => {
  for (const child of liveServers) {
    try {
      child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
  if (process.env.REFLEXR_KEEP_TMP) return;
  for (const dir of tempDirs) {
    try {
      rmSync(dir, { recursive: true, force: true });
    } catch {
      // best effort
    }
  }
});

async function tempDir(prefix) {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  tempDirs.add(dir);
  return dir;
}

// ----- processes ----------------------------------------------------------------

/**
 * Runs a program to its end: `{ code, signal, stdout, stderr }`, whatever the
 * exit code. Rejects only when it cannot be started (or is not done within
 * `timeout` ms, when given).
 */
function run(bin, args, { env = process.env, input, timeout } = {}) {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(bin, args, { env, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d) => (stderr += d));
    let timer;
    if (timeout) {
      timer = setTimeout(() => {
        child.kill('SIGKILL');
        reject(new Error(`${bin} ${args.join(' ')}: not done after ${timeout} ms\n${stderr}`));
      }, timeout);
    }
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(new Error(`cannot run ${bin}: ${err.message}`));
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolvePromise({ code, signal, stdout, stderr });
    });
    // A command that reads no input may exit before its stdin is written:
    // the write then fails with EPIPE, which is not the command's failure
    // (its exit code and output say how it went).
    child.stdin.on('error', (err) => {
      if (err.code !== 'EPIPE') reject(err);
    });
    child.stdin.end(input ?? '');
  });
}

/** The environment without REFLEXR_ADMIN_TOKEN, plus `extra`. */
function cleanEnv(extra = {}) {
  const env = { ...process.env };
  delete env.REFLEXR_ADMIN_TOKEN;
  return { ...env, ...extra };
}

/**
 * A fresh demo database: `events_app <path> ...args` in a new temp
 * directory (e.g. `['--expired-tablets', '3']`). Resolves to its path.
 */
export async function makeDb(args = []) {
  const dir = await tempDir('reflexr-browser-db-');
  const db = join(dir, 'events.db');
  const r = await run(eventsAppBin, [db, ...args], { timeout: 120_000 });
  if (r.code !== 0) {
    throw new Error(
      `${eventsAppBin} ${db} exited with ${r.code ?? r.signal}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`,
    );
  }
  return db;
}

/**
 * A fresh file holding the booking workflow's two runs (the testkit's
 * `bookings`: one succeeded after its steps, one suspended at its wait for
 * an event). Resolves to `{ db, done, waiting }`: its path and the runs' ids.
 */
export async function makeBookingsDb() {
  const dir = await tempDir('reflexr-browser-db-');
  const db = join(dir, 'bookings.db');
  const r = await run(bookingsBin, [db], { timeout: 120_000 });
  if (r.code !== 0) {
    throw new Error(
      `${bookingsBin} ${db} exited with ${r.code ?? r.signal}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`,
    );
  }
  return { db, ...JSON.parse(r.stdout) };
}

/**
 * Runs `reflexr <db> ...args`: `{ code, stdout, stderr }`, whatever the exit
 * code. `opts.env` is added to the environment; `opts.input` goes to stdin.
 */
export async function cli(db, args, { env = {}, input } = {}) {
  const r = await run(reflexrBin, [db, ...args], {
    env: { ...process.env, ...env },
    input,
    timeout: 60_000,
  });
  return { code: r.code, stdout: r.stdout, stderr: r.stderr };
}

/**
 * Starts `reflexr <db> serve --listen 127.0.0.1:0 ...extraArgs` (without
 * REFLEXR_ADMIN_TOKEN, unless `env` gives one) and waits for its
 * `serving <path> on http://127.0.0.1:PORT` line.
 *
 * Resolves to `{ url, line, stop, stderr() }`: `url` without a trailing
 * slash; `stop()` sends SIGTERM and resolves when the server has exited 0
 * (rejects with its stderr otherwise).
 */
export async function serve(db, extraArgs = [], env = {}) {
  const args = [db, 'serve', '--listen', '127.0.0.1:0', ...extraArgs];
  const child = spawn(reflexrBin, args, {
    env: cleanEnv(env),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (d) => (stderr += d));
  const exited = new Promise((resolveExit) => {
    child.on('close', (code, signal) => {
      liveServers.delete(child);
      resolveExit({ code, signal });
    });
  });
  liveServers.add(child);
  // The server must not keep this process alive by itself (a test that
  // forgot to stop it would hang the run); the exit handler kills it.
  // Waiting for its line, or for its exit in stop(), holds a timer meanwhile.
  child.unref();
  child.stdout.unref?.();
  child.stderr.unref?.();
  const describe = () => `${reflexrBin} ${args.join(' ')}`;

  const line = await new Promise((resolveLine, reject) => {
    const lines = createInterface({ input: child.stdout });
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${describe()}: no "serving" line after 30 s\n--- stderr\n${stderr}`));
    }, 30_000);
    lines.once('line', (first) => {
      clearTimeout(timer);
      resolveLine(first);
    });
    child.once('error', (err) => {
      clearTimeout(timer);
      reject(new Error(`cannot run ${describe()}: ${err.message}`));
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(
        new Error(`${describe()} exited with ${code ?? signal} before serving\n--- stderr\n${stderr}`),
      );
    });
  });
  // Keep draining stdout, so the server never blocks on a full pipe.
  child.stdout.resume();

  const match = /^serving .* on (http:\/\/\S+?)\/?(?: \(read-only\))?$/.exec(line);
  if (!match) {
    child.kill('SIGKILL');
    throw new Error(`${describe()}: unexpected first line ${JSON.stringify(line)}\n--- stderr\n${stderr}`);
  }
  const url = match[1];

  let stopping;
  async function stop() {
    stopping ??= (async () => {
      // Hold this process open until the server's exit is seen.
      child.ref();
      child.stdout.ref?.();
      child.stderr.ref?.();
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
      const { code, signal } = await exited;
      clearTimeout(timer);
      if (code !== 0) {
        throw new Error(
          `${describe()} exited with ${code ?? signal} (want 0) on SIGTERM\n--- stderr\n${stderr}`,
        );
      }
    })();
    return stopping;
  }

  return { url, line, stop, stderr: () => stderr, process: child };
}

// ----- the browser ----------------------------------------------------------------

/**
 * Records a page's console errors (failed loads included) and uncaught
 * errors into `page.errors`; the browser's own /favicon.ico request is
 * ignored.
 */
function watch(page) {
  if (page.errors) return page;
  page.errors = [];
  page.on('console', (msg) => {
    if (msg.type() !== 'error') return;
    const { url, lineNumber } = msg.location();
    // Chromium asks for /favicon.ico by itself, for any document (a JSON
    // one too); its 404 is not the page's doing. (A page can avoid the
    // request with <link rel="icon" href="data:,">.)
    if (url && new URL(url).pathname === '/favicon.ico') return;
    page.errors.push(`console.error: ${msg.text()}${url ? ` (${url}:${lineNumber})` : ''}`);
  });
  page.on('pageerror', (err) => {
    page.errors.push(`pageerror: ${err.stack || err.message || String(err)}`);
  });
  return page;
}

/**
 * Headless chromium with a fresh, empty profile. Resolves to
 * `{ context, page, close }`; every page of the context (this one and any
 * opened later) records errors into `page.errors`. `options` go to
 * `launchPersistentContext` (e.g. `{ viewport: { width: 1280, height: 800 } }`).
 * `close()` closes the browser and removes the profile.
 */
export async function launch(options = {}) {
  const userDataDir = await tempDir('reflexr-browser-profile-');
  let context;
  try {
    context = await chromium.launchPersistentContext(userDataDir, {
      executablePath: chromiumBin,
      headless: true,
      args: chromiumArgs,
      ...options,
    });
  } catch (err) {
    await rm(userDataDir, { recursive: true, force: true });
    throw err;
  }
  context.setDefaultTimeout(15_000);
  context.on('page', watch);
  context.pages().forEach(watch);
  const page = watch(context.pages()[0] ?? (await context.newPage()));

  let closing;
  const close = () =>
    (closing ??= (async () => {
      try {
        await context.close();
      } finally {
        await rm(userDataDir, { recursive: true, force: true });
        tempDirs.delete(userDataDir);
      }
    })());
  return { context, page, close };
}

// ----- HTTP --------------------------------------------------------------------------

/**
 * A request to the admin server: `{ status, json, text, headers }`; `json` is
 * null when the body is not JSON. `body` (any JSON value) is sent as
 * `application/json`; `token` as `Authorization: Bearer <token>`.
 */
export async function api(url, path, { method, token, body } = {}) {
  const headers = { accept: 'application/json' };
  if (token) headers.authorization = `Bearer ${token}`;
  const init = { method: method ?? (body === undefined ? 'GET' : 'POST'), headers };
  if (body !== undefined) {
    headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const res = await fetch(new URL(path, url.endsWith('/') ? url : `${url}/`), init);
  const text = await res.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    // not JSON
  }
  return { status: res.status, json, text, headers: res.headers };
}
