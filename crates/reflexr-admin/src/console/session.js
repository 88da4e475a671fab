// The session (the token, the operator's name, read-only mode) and the
// notice bar. The one place they live: every other module imports them.

import { $ } from './dom.js';

/** Kept in this tab's sessionStorage: a reload keeps them, another tab does not. */
export const session = {
  get token() { return sessionStorage.getItem('reflexr.token') ?? ''; },
  set token(v) { if (v) sessionStorage.setItem('reflexr.token', v); else sessionStorage.removeItem('reflexr.token'); },
  get operator() { return sessionStorage.getItem('reflexr.operator') ?? ''; },
  set operator(v) { if (v) sessionStorage.setItem('reflexr.operator', v); },
  readOnly: false,
};

export const canChange = () => !session.readOnly;

/**
 * An error in one line. An API error is known by its name, not by
 * `instanceof`, so this module need not import api.js (which imports it).
 */
export function describe(e) {
  if (e?.name === 'ApiError') {
    return e.status ? `${e.status} ${e.code}: ${e.message}` : e.message;
  }
  return String(e?.message ?? e);
}

export function notify(text, kind = 'error') {
  const box = $('#notice');
  $('#notice-text').textContent = text;
  box.classList.toggle('info', kind === 'info');
  box.hidden = false;
}

export function showError(e) {
  notify(describe(e));
}
