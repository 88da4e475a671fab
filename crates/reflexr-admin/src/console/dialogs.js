// The dialogs: sign-in after a 401, and the confirmation every change
// asks for (who and why, for the audit log).

import { $, h } from './dom.js';
import { notify, session, showError } from './session.js';

let signingIn = false;

/**
 * How the page is drawn again after a change. app.js sets it: it imports
 * the pages, which import this module, so this one cannot import it.
 */
let redraw = async () => {};

export function setRedraw(f) {
  redraw = f;
}

/** The sign-in dialog, after a 401: says whether the token was wrong. */
export function askForToken(e) {
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
  signingIn = true;
  dialog.showModal();
}

/**
 * Takes what the sign-in form holds, if it was asked for: true then, and
 * app.js boots again with the new token.
 */
export function signIn() {
  if (!signingIn) return false;
  signingIn = false;
  const form = $('#login-form');
  session.token = form.token.value.trim();
  session.operator = form.operator.value.trim();
  $('#notice').hidden = true;
  return true;
}

/**
 * Asks before a change. Resolves to {operator, reason, ...fields} or null.
 * `typed`: a word the operator must type to confirm (destructive changes).
 */
export function confirmChange({ title, text, items = [], more = false, typed, fields = [], action = 'Confirm' }) {
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
export async function act(confirmation, run, done) {
  const who = await confirmChange(confirmation);
  if (!who) return false;
  try {
    const result = await run(who);
    notify(done(result), 'info');
    await redraw();
    return true;
  } catch (e) {
    showError(e);
    return false;
  }
}
