/**
 * Which cells carry an agent's mark, and when a mark is true (pure: unit-tested without a page).
 *
 * A mark names its change. It is drawn only on a view that shows the change: a view synced (loaded
 * from disk) after the change was recorded, or a live collaborative one, and whose cell shows the source
 * the change left (from the change's detail; until the detail is known an edited cell is not drawn). A
 * drawn mark whose cell stops showing that source was edited since (by the person, or anyone) and is
 * forgotten; so is the mark of a change undone or overwritten.
 */
import { IChange } from './api';

export interface IMark {
  changeId: string;
  tooltip: string;
  /** The order of the change among those this page was told (see `MarkBook.seq`). */
  seq: number;
  /** The source the change left in the cell; undefined: not known (the source when first drawn). */
  expected?: string;
  /** Waiting for the change's detail (its sources): not drawn yet. */
  pending: boolean;
  /** Drawn at least once (from then on, a different source means an edit). */
  shown: boolean;
}

export class MarkBook {
  /** How many changes were recorded: a view synced at `seq` shows every change up to it. */
  get seq(): number {
    return this._seq;
  }

  /**
   * A recorded change: mark the cells it left in place (inserted or changed), forget the marks of the
   * change it undid or overwrote. `pending`: the change's sources will be told (`expect`).
   */
  record(change: IChange, tooltip: string, pending: boolean): IMark[] {
    const seq = ++this._seq;
    for (const id of [change.undoes, ...(change.overwrites ?? [])]) {
      if (id) {
        this.forgetChange(String(id));
      }
    }
    const marks = this._path(change.path);
    const made: IMark[] = [];
    // An undo restores, and a save over agents' changes is the person's own: neither marks its cells.
    const unmarked = change.kind === 'undo' || isOverwrite(change);
    for (const cell of change.cells) {
      if (!cell.id) {
        continue;
      }
      if (cell.what.includes('deleted') || unmarked) {
        marks.delete(cell.id);
      } else {
        const mark = {
          changeId: change.id,
          tooltip,
          seq,
          pending,
          shown: false
        };
        marks.set(cell.id, mark);
        made.push(mark);
      }
    }
    return made;
  }

  /** The sources change `changeId` left, by cell id (null: they cannot be known). */
  expect(
    path: string,
    changeId: string,
    sources: Map<string, string> | null
  ): void {
    for (const [cellId, mark] of this._marks.get(path) ?? []) {
      if (mark.changeId === changeId && mark.pending) {
        mark.pending = false;
        mark.expected = sources?.get(cellId);
      }
    }
  }

  /** Forget every mark of a change (undone, overwritten). */
  forgetChange(changeId: string): void {
    for (const marks of this._marks.values()) {
      for (const [cellId, mark] of marks) {
        if (mark.changeId === changeId) {
          marks.delete(cellId);
        }
      }
    }
  }

  /** Forget a cell's mark (dismissed). */
  dismiss(path: string, cellId: string): void {
    this._marks.get(path)?.delete(cellId);
  }

  /** Whether `path` has marks (a view without any need not read its cells' sources). */
  has(path: string, cellId: string): boolean {
    return this._marks.get(path)?.has(cellId) ?? false;
  }

  /**
   * The mark to draw on cell `cellId` of `path`, which shows `source` in a view synced at `synced`
   * (`Infinity` for a live view); null when none is true there.
   */
  mark(
    path: string,
    cellId: string,
    source: string,
    synced: number
  ): IMark | null {
    const mark = this._marks.get(path)?.get(cellId);
    if (!mark || mark.pending || mark.seq > synced) {
      return null;
    }
    if (mark.expected === undefined) {
      mark.expected = source;
    }
    if (source !== mark.expected) {
      if (mark.shown) {
        this._marks.get(path)?.delete(cellId); // edited since it was drawn
      }
      return null; // (not shown yet: the view does not show the change yet)
    }
    mark.shown = true;
    return mark;
  }

  private _path(path: string): Map<string, IMark> {
    let marks = this._marks.get(path);
    if (!marks) {
      marks = new Map();
      this._marks.set(path, marks);
    }
    return marks;
  }

  private _seq = 0;
  private _marks = new Map<string, Map<string, IMark>>();
}

/** The sources a change's detail says it left, by cell id (cells whose source it set). */
export function sourcesAfter(detail: {
  cells: { id: string | null; after: { [key: string]: any } | null }[];
}): Map<string, string> {
  const sources = new Map<string, string>();
  for (const cell of detail.cells) {
    const source = cell.after?.source;
    if (cell.id && typeof source === 'string') {
      sources.set(cell.id, source);
    }
  }
  return sources;
}

/** Whether a change is a save that overwrote agents' changes (the ledger's `overwrite`). */
export function isOverwrite(change: IChange): boolean {
  return (
    change.kind === 'overwrite' ||
    change.action === 'overwrite' ||
    (change.overwrites?.length ?? 0) > 0
  );
}
