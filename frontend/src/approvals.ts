/**
 * The requests waiting for the person's decision, as the page knows them, and how they are shown (pure:
 * unit-tested without a page). See docs/approvals.md.
 */
import { IApproval } from './api';
import { cellDiffText } from './format';
import { TranslationBundle } from '@jupyterlab/translation';

/** How many decided request ids are remembered, so that a late read does not list them again. */
const GONE_KEPT = 1000;

/**
 * The pending requests: the server's list, read on (re)connecting, and the events told since. A request
 * told by its event while the list is being read stays (the list's answer may predate it); one decided
 * meanwhile goes, and is never listed again.
 */
export class PendingBook {
  /** Oldest first. */
  get items(): readonly IApproval[] {
    return this._items;
  }

  get(id: number): IApproval | undefined {
    return this._items.find(a => a.id === id);
  }

  /** A read of the list starts: the requests told from now on are kept over its answer. */
  reading(): void {
    this._told = new Map();
  }

  /** The list's pending requests (read since `reading()`). */
  listed(pending: readonly IApproval[]): void {
    const listed = new Set(pending.map(a => a.id));
    const known = new Map(this._items.map(a => [a.id, a]));
    this._set([
      ...pending
        .filter(a => !this._gone.has(a.id))
        // a request read in full already is kept over the list's preview of it
        .map(a => {
          const before = known.get(a.id);
          return a.preview && before && !before.preview ? before : a;
        }),
      ...[...this._told.values()].filter(a => !listed.has(a.id))
    ]);
  }

  /** A request read in full, in place of its preview (nothing when it left the list meanwhile). */
  full(approval: IApproval): boolean {
    if (!this.get(approval.id) || approval.state !== 'pending') {
      return false;
    }
    this._set(this._items.map(a => (a.id === approval.id ? approval : a)));
    return true;
  }

  /** A request told by its event (with its details): false when known already or decided. */
  add(approval: IApproval): boolean {
    if (
      approval.state !== 'pending' ||
      this._gone.has(approval.id) ||
      this.get(approval.id)
    ) {
      return false;
    }
    this._told.set(approval.id, approval);
    this._set([...this._items, approval]);
    return true;
  }

  /** A request was decided, expired or withdrawn: false when it was not listed. */
  remove(id: number): boolean {
    this._gone.add(id);
    if (this._gone.size > GONE_KEPT) {
      this._gone.delete(this._gone.values().next().value as number);
    }
    this._told.delete(id);
    const before = this._items.length;
    this._set(this._items.filter(a => a.id !== id));
    return this._items.length !== before;
  }

  private _set(items: IApproval[]): void {
    this._items = items.sort((a, b) => a.id - b.id);
  }

  private _items: IApproval[] = [];
  private _told = new Map<number, IApproval>();
  private _gone = new Set<number>();
}

/** The notebook a request is about, as JupyterLab names it (relative to the root), or null. */
export function notebookOf(approval: IApproval): string | null {
  const path = approval.details?.path ?? approval.path;
  // (the notebook routes record the URL's path, with a leading slash)
  return typeof path === 'string' ? path.replace(/^\/+/, '') : null;
}

/** The query parameter of a URL opening JupyterLab at a request (an MCP client's URL elicitation). */
export const APPROVAL_URL_PARAM = 'agent-approval';

/** The router's pattern for such a URL. */
export const APPROVAL_URL_PATTERN = new RegExp(
  `[?&]${APPROVAL_URL_PARAM}=\\d+`
);

/** The request a URL's query (`?agent-approval=12`) opens JupyterLab at, or null. */
export function approvalInUrl(search: string): number | null {
  const value = new URLSearchParams(search).get(APPROVAL_URL_PARAM);
  return value !== null && /^\d+$/.test(value) ? Number(value) : null;
}

/** What the notification says: `agent:ci-bot wants to run 2 cells in report.ipynb`. */
export function asked(trans: TranslationBundle, approval: IApproval): string {
  return trans.__('%1 wants to %2', approval.agent, approval.summary);
}

/** One part of what a request would do: a cell's code, source or diff (`diff`: a unified diff). */
export interface IShown {
  title: string;
  text: string;
  diff: boolean;
}

/**
 * The characters an agent's text may carry that would not show as what they are: C0 controls but tab and
 * newline, DEL, C1; bidirectional controls (Trojan Source: U+202A-U+202E, U+2066-U+2069, the marks U+200E,
 * U+200F, U+061C) and invisible ones (U+200B-U+200D, U+2060, U+FEFF).
 */
const UNSHOWN =
  // eslint-disable-next-line no-control-regex
  /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200b-\u200f\u202a-\u202e\u2060\u2066-\u2069\ufeff]/g;

/** How such a character is shown: `\r`, `\x1b`, else `\u202e`. */
export function escapeOf(char: string): string {
  if (char === '\r') {
    return '\\r';
  }
  if (char === '\x1b') {
    return '\\x1b';
  }
  return `\\u${char.charCodeAt(0).toString(16).padStart(4, '0')}`;
}

/**
 * `text` in pieces: `[piece, false]` as it is, `[escape, true]` for each character that would not show as
 * what it is (the panel marks those).
 */
export function visibleParts(text: string): [string, boolean][] {
  const parts: [string, boolean][] = [];
  let last = 0;
  const unshown = new RegExp(UNSHOWN.source, 'g');
  let match: RegExpExecArray | null;
  while ((match = unshown.exec(text)) !== null) {
    const at = match.index;
    if (at > last) {
      parts.push([text.slice(last, at), false]);
    }
    parts.push([escapeOf(match[0]), true]);
    last = at + match[0].length;
  }
  if (last < text.length || parts.length === 0) {
    parts.push([text.slice(last), false]);
  }
  return parts;
}

/** How many characters of `text` would not show as what they are. */
export function unshownCount(text: string): number {
  return (text.match(UNSHOWN) ?? []).length;
}

/** Lines the code box shows before it scrolls (its max-height, base.css). */
export const BOX_LINES = 14;
/** Characters of a line the box shows before it scrolls sideways (about). */
export const BOX_COLUMNS = 100;

/** What says that a part is longer or wider than its box shows, or '' when it all fits. */
export function beyondBox(trans: TranslationBundle, text: string): string {
  const lines = text.split('\n');
  const longest = Math.max(...lines.map(l => l.length));
  if (lines.length <= BOX_LINES && longest <= BOX_COLUMNS) {
    return '';
  }
  return trans.__(
    '%1 lines, the longest %2 characters: scroll the box to read it all',
    lines.length,
    longest
  );
}

/**
 * What warns the person that part of a request is not in view: cut by the server (`truncated` bytes),
 * or only the list's preview read so far. '' when it is all there.
 */
export function notShown(
  trans: TranslationBundle,
  approval: IApproval
): string {
  if (approval.preview) {
    return trans.__(
      'Only a preview is shown: the full request is being read (approving waits for it).'
    );
  }
  if (approval.truncated) {
    return trans.__(
      '%1 bytes of what it would do are not shown (cut by the server): approve only if what is shown is enough.',
      approval.truncated
    );
  }
  return '';
}

/** What a request would do, in full, part by part (its `details`, as docs/approvals.md lists them). */
export function shown(trans: TranslationBundle, approval: IApproval): IShown[] {
  const details = approval.details ?? {};
  const cells: any[] | null = Array.isArray(details.cells)
    ? details.cells
    : Array.isArray(details.change?.cells)
      ? details.change.cells // an undo: the change it undoes
      : null;
  if (!cells) {
    const what = details.body ?? details;
    return [
      {
        title: '',
        text: Object.keys(what).length ? JSON.stringify(what, null, 1) : '',
        diff: false
      }
    ];
  }
  const settings = Object.entries(details).filter(([key]) => key !== 'cells');
  const how: IShown[] =
    settings.length && cells.some(cell => typeof cell?.code === 'string')
      ? [
          {
            // an eval: where and how it runs
            title: trans.__('runs with'),
            text: settings
              .map(([key, value]) => `${key}: ${JSON.stringify(value)}`)
              .join('\n'),
            diff: false
          }
        ]
      : [];
  // a notebook run's ops: their diff first (an edit's), then the cells it runs
  const edits: any[] = Array.isArray(details.edit?.cells)
    ? details.edit.cells
    : [];
  return [
    ...how,
    ...edits.map(cell => shownCell(trans, cell, 0)),
    ...cells.map((cell, index) => shownCell(trans, cell, index))
  ];
}

/** One cell of a request, as {@link shown} gives it. */
function shownCell(trans: TranslationBundle, cell: any, index: number): IShown {
  if (typeof cell.code === 'string') {
    // an eval's cell
    return {
      title: cell.title || trans.__('cell %1', index + 1),
      text: cell.code,
      diff: false
    };
  }
  if (Array.isArray(cell.what)) {
    // an edit's cell (or the change an undo undoes): its diff
    return {
      title: trans.__('cell %1: %2', cell.id ?? '?', cell.what.join(', ')),
      text: cellDiffText(trans, cell),
      diff: typeof cell.diff === 'string'
    };
  }
  // a notebook run's cell, as it would run
  return {
    title: cell.new
      ? trans.__('cell %1 (new)', cell.id ?? index + 1)
      : trans.__('cell %1', cell.id ?? index + 1),
    text: typeof cell.source === 'string' ? cell.source : '',
    diff: false
  };
}

/**
 * The cells that wait for a decision: a notebook run's cells, the cells an edit (or an undo) would touch,
 * by notebook path and cell id, with the request's id (the oldest request's, for a cell in several).
 */
export function pendingCells(
  approvals: readonly IApproval[]
): Map<string, Map<string, number>> {
  const marks = new Map<string, Map<string, number>>();
  for (const approval of approvals) {
    const details = approval.details ?? {};
    const path = notebookOf(approval);
    const cells: any[] = [
      ...(Array.isArray(details.cells)
        ? details.cells
        : (details.change?.cells ?? [])),
      ...(Array.isArray(details.edit?.cells) ? details.edit.cells : []) // a run's ops
    ];
    if (typeof path !== 'string') {
      continue;
    }
    for (const cell of cells) {
      // (an eval's code has no id; a cell a run's ops would insert is not there yet. A cell an edit
      // would insert, or an undo would bring back, has an id no cell of the notebook has now.)
      if (typeof cell.id !== 'string' || cell.new) {
        continue;
      }
      let cellsOf = marks.get(path);
      if (!cellsOf) {
        cellsOf = new Map();
        marks.set(path, cellsOf);
      }
      if (!cellsOf.has(cell.id)) {
        cellsOf.set(cell.id, approval.id); // the oldest request first
      }
    }
  }
  return marks;
}
