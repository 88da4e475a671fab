// The WebSocket stream at /api/v1/stream: one for the whole console, so
// the pages share it and a page's subscriptions end with the page.

import { ApiError } from './api.js';
import { askForToken } from './dialogs.js';
import { $ } from './dom.js';
import { notify, session, showError } from './session.js';

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

export const stream = new Stream();

/** The header's badge: live, or reconnecting. */
function live(up) {
  const el = $('#live');
  el.textContent = up ? 'live' : 'reconnecting…';
  el.classList.toggle('live', up);
  el.classList.toggle('down', !up);
}
