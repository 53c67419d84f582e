/**
 * "Share my focus" (off by default): while the person has it on, this browser tab tells the server what it
 * shows (the current notebook, its active cell with source and outputs, the text selected in it, the
 * kernel's state), debounced on every change and every 20 s as a heartbeat, for every agent or the agents
 * the person names. Turning it off, or closing the page, removes it at once. The server keeps it in memory
 * only (docs/panel.md). Agents' UI actions (open a notebook, reveal a cell, show a change's diff, open an
 * approval) come on the event bus: this tab does the ones addressed to it, and shows those addressed to no
 * tab as a notification. Nothing else an agent sends is ever run. This module holds the pure parts (tested
 * in src/__tests__/focus.spec.ts); `FocusSharer` (share.ts) is the part in the page.
 */
import { EVENTS, IAgentEvent } from './api';
import { trans } from './i18n';

export const FOCUS_EVENT = `${EVENTS}focus/v1`;
/** Milliseconds a burst of changes waits before it is published once. */
export const DEBOUNCE_MS = 300;
/** Milliseconds between two publications of an unchanged focus (the server forgets it after its ttl). */
export const HEARTBEAT_MS = 20000;
/** Characters of a published body past which the outputs' data (images...) is left out. */
export const MAX_BODY_CHARS = 1500000;
/** The UI actions this page does; anything else is ignored. */
export const UI_ACTIONS = [
  'open_notebook',
  'reveal_cell',
  'show_change',
  'open_approval'
] as const;

export type UiActionName = (typeof UI_ACTIONS)[number];

export interface IUiAction {
  action: UiActionName;
  user: string;
  tab: string | null;
  path?: string;
  cell_id?: string;
  cell_index?: number;
  change_id?: string;
  approval_id?: number;
  message?: string;
}

export interface IPosition {
  line: number;
  column: number;
}

export interface IFocusBody {
  agents: 'all' | string[];
  path: string | null;
  cell: {
    id: string | null;
    index: number;
    cell_type: string;
    source: string;
    execution_count: number | null;
    outputs: any[];
  } | null;
  selection: { text: string; start: IPosition; end: IPosition } | null;
  kernel: { name: string | null; status: string | null } | null;
}

/** A new id for this page (8 to 64 letters, digits, '_' or '-', as the server wants). */
export function makeTabId(random: () => number = Math.random): string {
  let id = 'tab-';
  for (let i = 0; i < 16; i++) {
    id += Math.floor(random() * 16).toString(16);
  }
  return id;
}

/** Who the person shares with, from what they typed: '' is every agent, else token names (comma or
 * space separated). */
export function parseAgents(text: string): 'all' | string[] {
  const names = text
    .split(/[\s,]+/)
    .map(n => n.trim())
    .filter(n => n && n.toLowerCase() !== 'all');
  return names.length ? [...new Set(names)] : 'all';
}

/** Who it is shared with, in words. */
export function sharedWith(agents: 'all' | string[]): string {
  return agents === 'all'
    ? trans.__('every agent')
    : agents.map(a => `agent:${a}`).join(', ');
}

/** The text between two positions (0-based lines and columns) of `source`; '' when they are equal. */
export function selectionText(
  source: string,
  start: IPosition,
  end: IPosition
): string {
  const offset = (p: IPosition): number => {
    const lines = source.split('\n');
    let at = 0;
    for (let i = 0; i < Math.min(p.line, lines.length); i++) {
      at += lines[i].length + 1;
    }
    return Math.min(source.length, at + p.column);
  };
  const [a, b] = [offset(start), offset(end)].sort((x, y) => x - y);
  return source.slice(a, b);
}

/** The body as sent: when it is too large, the outputs keep their text only (images and other data go). */
export function fitBody(
  body: IFocusBody,
  maxChars = MAX_BODY_CHARS
): IFocusBody {
  if (!body.cell || JSON.stringify(body).length <= maxChars) {
    return body;
  }
  const outputs = body.cell.outputs.map(output => {
    if (!output || typeof output !== 'object' || !output.data) {
      return output;
    }
    const data: { [mime: string]: unknown } = {};
    for (const mime of ['text/plain', 'text/markdown']) {
      if (mime in output.data) {
        data[mime] = output.data[mime];
      }
    }
    return { ...output, data };
  });
  const cut = { ...body, cell: { ...body.cell, outputs } };
  if (JSON.stringify(cut).length <= maxChars) {
    return cut;
  }
  return { ...cut, cell: { ...cut.cell, outputs: [] } };
}

/** What a focus event asks of the page whose tab is `tab`: an action to do here ('do'), one to offer as a
 * notification ('offer': addressed to no tab), the time an agent read this tab's focus ('read'), or
 * nothing. */
export function eventFor(
  event: IAgentEvent,
  tab: string
):
  | { kind: 'do' | 'offer'; action: IUiAction }
  | { kind: 'read'; agent: string }
  | null {
  if (event.schema_id !== FOCUS_EVENT) {
    return null;
  }
  if (event.event === 'read') {
    return event.tab === tab
      ? { kind: 'read', agent: String(event.user) }
      : null;
  }
  if (
    event.event !== 'action' ||
    !(UI_ACTIONS as readonly string[]).includes(event.action)
  ) {
    return null;
  }
  const action = event as unknown as IUiAction;
  if (event.tab === tab) {
    return { kind: 'do', action };
  }
  return event.tab === null || event.tab === undefined
    ? { kind: 'offer', action }
    : null;
}

/** What an action shows the person, in a line. */
export function describeAction(action: IUiAction): string {
  const who = action.user || trans.__('an agent');
  switch (action.action) {
    case 'open_notebook':
      return trans.__('%1 asks you to look at %2', who, action.path ?? '');
    case 'reveal_cell':
      return trans.__(
        '%1 points at cell %2 of %3',
        who,
        action.cell_id ?? `#${action.cell_index}`,
        action.path ?? ''
      );
    case 'show_change':
      return trans.__(
        '%1 asks you to review change %2 of %3',
        who,
        action.change_id ?? '',
        action.path ?? ''
      );
    case 'open_approval':
      return trans.__(
        '%1 asks you to decide request %2',
        who,
        String(action.approval_id ?? '')
      );
  }
  return '';
}
