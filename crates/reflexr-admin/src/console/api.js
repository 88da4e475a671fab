// The REST routes under /api/v1, with the session's token as a header;
// and the server's own enum lists, so the pages name what this server
// knows rather than a copy that can drift.

import { askForToken } from './dialogs.js';
import { session } from './session.js';

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
  }
}

export async function api(path, { method = 'GET', body } = {}) {
  const headers = { Accept: 'application/json' };
  if (session.token) headers.Authorization = `Bearer ${session.token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
    });
  } catch (e) {
    throw new ApiError(0, 'unreachable', `The server did not answer: ${e.message}`);
  }
  let data = null;
  try { data = await res.json(); } catch { /* not JSON: said below */ }
  if (!res.ok) {
    const err = data?.error ?? {};
    const e = new ApiError(res.status, err.code ?? `http_${res.status}`, err.message ?? res.statusText);
    if (res.status === 401) askForToken(e);
    throw e;
  }
  return data;
}

/** POST a change, with who and why. */
export function change(path, who, extra = {}) {
  return api(path, { method: 'POST', body: { operator: who.operator, reason: who.reason, ...extra } });
}

/** The server's enum lists, filled by `loadVocabulary` before the first page. */
export const vocabulary = {
  runStates: [],
  deadLetterKinds: [],
};

let loaded = false;

/**
 * Reads the enum lists once from the server's OpenAPI document (after
 * sign-in: it wants the token like any route). A list missing from it is
 * an error, not an empty filter.
 */
export async function loadVocabulary() {
  if (loaded) return;
  const doc = await api('/api/v1/openapi.json');
  const list = (what, ...path) => {
    const found = path.reduce((v, k) => v?.[k], doc)?.enum;
    if (!Array.isArray(found)) throw new Error(`The server's OpenAPI document has no list of ${what}.`);
    return found;
  };
  const schema = (name, field) => ['components', 'schemas', name, 'properties', field];
  Object.assign(vocabulary, {
    runStates: list('run states', ...schema('Run', 'state')),
    deadLetterKinds: list('dead letter kinds', ...schema('DeadLetter', 'kind')),
  });
  loaded = true;
}
