// Rules: what is registered in the file, with its cursor and lag; each
// version live or in shadow, and the promote of a live rule to its shadow.

import { api, change } from './api.js';
import { act } from './dialogs.js';
import { enc, h, num, pre, table, when } from './dom.js';
import { canChange } from './session.js';

/** Live, or the shadow of a rule (and where it takes over, once promoted). */
function role(r) {
  if (r.shadow_of === null || r.shadow_of === undefined) return 'live';
  const of = `shadow of ${r.shadow_of}`;
  return r.promote_at === null || r.promote_at === undefined ? of : `${of}, taking over after seq ${num(r.promote_at)}`;
}

/** What a shadow would have fired, and the decisions it failed. */
function firedInShadow(r) {
  if (r.shadow_of === null || r.shadow_of === undefined) return '–';
  return `${num(r.shadow_fired)}${r.shadow_errored ? ` (${num(r.shadow_errored)} failed)` : ''}`;
}

/**
 * The promote of a live rule to its version in shadow: the dialog says
 * what the handover does; the answer, where it happens.
 */
function promoteButton(r, shadow) {
  return h('button', {
    type: 'button',
    data: { action: 'promote', rule: r.name },
    onclick: () => act({
      title: `Promote ${r.name} to version ${shadow.version}`,
      text: `Version ${shadow.version}, in shadow as ${shadow.name} (at seq ${num(shadow.cursor)}, it would have fired ${num(shadow.shadow_fired)}), takes over from version ${r.version}: the live version decides and fires up to the further of the two cursors, the shadow after it. Once both reached it, version ${r.version} retires and its state is replaced by the one the shadow built.`,
      action: 'Promote',
    }, (who) => change(`/api/v1/rules/${enc(r.name)}/promote`, who),
    (res) => `${r.name}: version ${shadow.version} takes over after seq ${num(res.at)}.`),
  }, 'Promote…');
}

export async function rules(main) {
  const list = await api('/api/v1/rules');
  // A live rule's version in shadow, not yet promoted: what Promote hands over to.
  const pending = (r) => list.find((s) => s.shadow_of === r.name && (s.promote_at === null || s.promote_at === undefined));
  const columns = [
    { label: 'name', cell: (r) => r.name },
    { label: 'workspace', cell: (r) => r.workspace },
    { label: 'version', cell: (r) => num(r.version), class: 'num' },
    { label: 'as', cell: role },
    { label: 'cursor', cell: (r) => num(r.cursor), class: 'num' },
    { label: 'lag', cell: (r) => num(r.lag), class: 'num' },
    { label: 'fired in shadow', cell: firedInShadow, class: 'num' },
    { label: 'here', cell: (r) => (r.registered_here ? 'registered in this process' : '–') },
    { label: 'runs', cell: (r) => (r.shadow_of ? '–' : h('a', { href: `#/runs?rule=${enc(r.name)}` }, 'its runs')) },
    { label: 'definition', cell: (r) => h('details', {}, h('summary', {}, 'show'), pre(r.definition)), class: 'wrap' },
    { label: 'updated', cell: (r) => when(r.updated_at) },
  ];
  if (canChange() && list.some((r) => !r.shadow_of && pending(r))) {
    columns.push({
      label: 'actions',
      cell: (r) => {
        const shadow = r.shadow_of ? undefined : pending(r);
        return shadow ? promoteButton(r, shadow) : '';
      },
    });
  }
  main.append(h('h1', {}, 'Rules'));
  if (list.some((r) => r.shadow_of)) {
    main.append(h('p', { class: 'hint' },
      'A version in shadow (named rule@vN) decides beside its live rule and fires nothing; promoting the live rule hands over to it at one position.'));
  }
  main.append(table('Rules', columns, list, { empty: 'No rules registered in this file.' }));
  return undefined;
}
