// `reflexr <DB> mcp` with the official MCP TypeScript SDK clients over
// stdio, on a file the events-app example leaves: the v1 SDK
// (@modelcontextprotocol/sdk, revision 2025-11-25, by initialize) calls
// every read tool and checks the answers against the CLI's --json output,
// retries a dead letter as a dry run and then for real, and checks the
// file; read-only mode hides and refuses the mutating tools; the v2 client
// (@modelcontextprotocol/client) pinned to revision 2026-07-28 (stateless,
// server/discover) gets the same answers.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { Client as ClientV2 } from '@modelcontextprotocol/client';
import { StdioClientTransport as StdioClientTransportV2 } from '@modelcontextprotocol/client/stdio';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const target = process.env.CARGO_TARGET_DIR ? resolve(process.env.CARGO_TARGET_DIR) : join(root, 'target');
const reflexr = process.env.REFLEXR_BIN || join(target, 'debug', 'reflexr');
const eventsApp = process.env.EVENTS_APP_BIN || join(target, 'debug', 'examples', 'events_app');

const MUTATING = ['retry', 'discard', 'unblock', 'reset_cursor', 'restart_follower', 'cancel_run',
  'reset_run_to_step', 'pause', 'resume', 'promote_rule', 'set_key_limits'];
const READS = ['status', 'stats', 'list_events', 'get_event', 'list_runs', 'get_run',
  'list_dead_letters', 'list_consumers', 'list_rules', 'list_followers', 'list_schedules', 'list_actions',
  'list_action_keys', 'audit_log'];

function run(bin, args) {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d) => { stdout += d; });
    child.stderr.setEncoding('utf8').on('data', (d) => { stderr += d; });
    child.on('error', reject);
    child.on('close', (code) => resolvePromise({ code, stdout, stderr }));
  });
}

/** The CLI's --json answer. */
async function cli(db, args) {
  const r = await run(reflexr, [db, ...args, '--json']);
  assert.equal(r.code, 0, `reflexr ${args.join(' ')}: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

/**
 * `f` to run when test `t` ends, after whatever was deferred later: the
 * last made is the first undone. (`t.after` hooks run in the order they
 * were added, and stop at the first that fails: a file's directory removed
 * first raced the server still open on it, failed, and left the server's
 * process — and the runner waiting on it — alive.)
 */
const deferred = new WeakMap();
function defer(t, f) {
  let undo = deferred.get(t);
  if (!undo) {
    undo = [];
    deferred.set(t, undo);
    t.after(async () => {
      let failed = null;
      for (const g of undo.reverse()) {
        try {
          await g();
        } catch (e) {
          failed ??= e;
        }
      }
      if (failed) throw failed;
    });
  }
  undo.push(f);
}

/** A file with three dead push deliveries (the demo's and two more). */
async function demo(t) {
  const dir = await mkdtemp(join(tmpdir(), 'reflexr-mcp-'));
  defer(t, () => rm(dir, { recursive: true, force: true }));
  const db = join(dir, 'events.db');
  const r = await run(eventsApp, [db, '--expired-tablets', '2']);
  assert.equal(r.code, 0, r.stderr);
  return db;
}

async function connect(t, db, args = [], { v2 = false } = {}) {
  const params = { command: reflexr, args: [db, 'mcp', ...args], stderr: 'pipe' };
  const client = v2
    ? new ClientV2({ name: 'reflexr-test', version: '1.0.0' }, { versionNegotiation: { mode: { pin: '2026-07-28' } } })
    : new Client({ name: 'reflexr-test', version: '1.0.0' });
  await client.connect(v2 ? new StdioClientTransportV2(params) : new StdioClientTransport(params));
  defer(t, () => client.close());
  return client;
}

/** A tool's structured answer (failing the test on isError). */
async function call(client, name, args = {}) {
  const r = await client.callTool({ name, arguments: args });
  assert.ok(!r.isError, `${name}: ${r.content?.[0]?.text}`);
  assert.equal(JSON.stringify(r.structuredContent), r.content[0].text, 'the text block is the same JSON');
  return r.structuredContent;
}

test('the v1 SDK (2025-11-25) lists, reads like the CLI, and retries a dead letter', async (t) => {
  const db = await demo(t);
  const client = await connect(t, db, ['--operator', 'assistant']);
  assert.equal(client.getServerVersion().name, 'reflexr');
  const caps = client.getServerCapabilities();
  assert.ok(caps.tools && caps.resources);

  const { tools } = await client.listTools();
  const names = tools.map((x) => x.name).sort();
  assert.deepEqual(names, [...READS, ...MUTATING].sort());
  for (const tool of tools) {
    assert.equal(tool.inputSchema.type, 'object', tool.name);
    assert.equal(tool.outputSchema.type, 'object', tool.name);
    assert.equal(tool.annotations.readOnlyHint, !MUTATING.includes(tool.name), tool.name);
  }
  assert.equal(tools.find((x) => x.name === 'discard').annotations.destructiveHint, true);

  // Every read tool against the CLI's --json on the same file.
  const status = await call(client, 'status');
  const cliStatus = await cli(db, ['status']);
  assert.deepEqual(status.runs, cliStatus.runs);
  assert.deepEqual(status.dead_letters, cliStatus.dead_letters);
  assert.deepEqual(status.consumers, cliStatus.consumers);
  assert.deepEqual(status.workspaces, cliStatus.workspaces);
  const stats = await call(client, 'stats');
  const cliStats = await cli(db, ['stats']);
  for (const k of ['events_appended', 'counters', 'runs', 'dead_letters', 'cursors', 'followers']) {
    assert.deepEqual(stats[k], cliStats[k], `stats.${k}`);
  }
  const events = await call(client, 'list_events', { workspace: 'events-app' });
  assert.deepEqual(events.events, await cli(db, ['events', '-w', 'events-app']));
  assert.equal(events.next_after, null, 'the page reached the end of the log');
  const one = await call(client, 'get_event', { seq: 1 });
  assert.deepEqual(one.event, events.events[0]);
  const byId = await call(client, 'get_event', { workspace: 'events-app', id: events.events[1].id });
  assert.deepEqual(byId.event, events.events[1]);
  const dead = await call(client, 'list_runs', { state: 'dead' });
  const cliDead = await cli(db, ['runs', '--state', 'dead']);
  assert.deepEqual(dead.runs.map((r) => r.id).sort(), cliDead.map((r) => r.id).sort());
  assert.equal(dead.runs.length, 3);
  const detail = await call(client, 'get_run', { id: dead.runs[0].id });
  assert.equal(detail.run.id, dead.runs[0].id);
  assert.equal(detail.run.state, 'dead');
  assert.deepEqual(detail.steps, await cli(db, ['runs', 'steps', detail.run.id]), 'a delivery has no steps');
  const letters = await call(client, 'list_dead_letters', {});
  assert.deepEqual(letters.dead_letters.map((d) => d.id).sort(), (await cli(db, ['dead-letters'])).map((d) => d.id).sort());
  assert.deepEqual((await call(client, 'list_consumers')).consumers, cliStatus.consumers);
  assert.deepEqual((await call(client, 'list_followers')).followers, []);
  const schedules = await call(client, 'list_schedules');
  assert.deepEqual(schedules.schedules.map((s) => s.name), ['attendee-reminders']);
  assert.deepEqual((await call(client, 'audit_log')).entries, []);

  // A tool that fails says why, as a result.
  const missing = await client.callTool({ name: 'get_run', arguments: { id: 'nope' } });
  assert.equal(missing.isError, true);
  assert.match(missing.content[0].text, /no run "nope"/);

  // Retry: a dry run by default, which changes nothing...
  const letter = letters.dead_letters.find((d) => d.id === 1);
  const dry = await call(client, 'retry', { target: 'dead_letters', ids: [1], reason: 'token renewed' });
  assert.deepEqual({ dry_run: dry.dry_run, matched: dry.matched, ids: dry.ids }, { dry_run: true, matched: 1, ids: [1] });
  assert.equal((await cli(db, ['dead-letters'])).length, 3, 'nothing retried yet');
  // ...then for real: the file says so, and the audit log has who and why.
  const done = await call(client, 'retry', { target: 'dead_letters', ids: [1], reason: 'token renewed', dry_run: false });
  assert.equal(done.dry_run, false);
  assert.deepEqual(done.done, ['1']);
  const after = await cli(db, ['dead-letters', '--all']);
  assert.equal(after.find((d) => d.id === 1).resolution, 'retried');
  const runs = await cli(db, ['runs']);
  assert.equal(runs.find((r) => r.id === letter.run_id).state, 'ready');
  const [entry] = (await call(client, 'audit_log')).entries;
  assert.deepEqual([entry.operator, entry.reason], ['assistant', 'token renewed']);

  // Discard needs confirm: without it, it says what it would do, and does not.
  const unconfirmed = await client.callTool({
    name: 'discard', arguments: { target: 'dead_letters', filter: { consumer: 'delivery/push' }, reason: 'x' },
  });
  assert.equal(unconfirmed.isError, true);
  assert.match(unconfirmed.content[0].text, /confirm: true.*would discard 2/);
  assert.equal((await cli(db, ['dead-letters'])).length, 2, 'nothing discarded');

  // Resources and templates.
  const { resources } = await client.listResources();
  assert.deepEqual(resources.map((r) => r.uri), ['reflexr://status']);
  const { resourceTemplates } = await client.listResourceTemplates();
  assert.deepEqual(resourceTemplates.map((r) => r.uriTemplate).sort(), [
    'reflexr://events/{workspace}/{id}', 'reflexr://rules/{name}/state/{scope}', 'reflexr://runs/{id}',
  ]);
  const read = await client.readResource({ uri: 'reflexr://status' });
  assert.equal(JSON.parse(read.contents[0].text).head_seq, stats.events_appended);
  const runRes = await client.readResource({ uri: `reflexr://runs/${letter.run_id}` });
  assert.equal(JSON.parse(runRes.contents[0].text).run.state, 'ready');
  await assert.rejects(client.readResource({ uri: 'reflexr://runs/nope' }), (e) => e.code === -32002);
});

test('read-only mode lists no mutating tool and refuses one called anyway', async (t) => {
  const db = await demo(t);
  const client = await connect(t, db, ['--read-only']);
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((x) => x.name).sort(), [...READS].sort());
  await assert.rejects(
    client.callTool({ name: 'retry', arguments: { target: 'dead_letters', ids: [1], reason: 'x', dry_run: false } }),
    (e) => e.code === -32602 && /read-only/.test(e.message),
  );
  assert.equal((await cli(db, ['dead-letters'])).length, 3, 'nothing changed');
  assert.equal((await call(client, 'status')).read_only, true);
});

test('the v2 client pinned to 2026-07-28 (stateless) gets the same answers', async (t) => {
  const db = await demo(t);
  const client = await connect(t, db, [], { v2: true });
  assert.equal(client.getNegotiatedProtocolVersion(), '2026-07-28');
  assert.deepEqual(client.getDiscoverResult().supportedVersions.slice(0, 2), ['2026-07-28', '2025-11-25']);
  const { tools } = await client.listTools();
  assert.equal(tools.length, READS.length + MUTATING.length);
  const status = await client.callTool({ name: 'status', arguments: {} });
  assert.ok(!status.isError);
  assert.deepEqual(status.structuredContent.runs, (await cli(db, ['status'])).runs);
  const letters = await client.callTool({ name: 'list_dead_letters', arguments: {} });
  assert.equal(letters.structuredContent.dead_letters.length, 3);
  const read = await client.readResource({ uri: 'reflexr://status' });
  assert.equal(JSON.parse(read.contents[0].text).head_seq, 2);
  const dry = await client.callTool({ name: 'retry', arguments: { target: 'runs', filter: { action: 'delivery/push' }, reason: 'check' } });
  assert.equal(dry.structuredContent.matched, 3);
  assert.equal(dry.structuredContent.dry_run, true);
});
