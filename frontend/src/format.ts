/** How the frontend says what the server said: pure functions of the routes' answers (unit-tested). */
import { ApiError, IChange, ISession } from './api';
import { TranslationBundle } from '@jupyterlab/translation';

/** The tooltip of a change: who, via which door, when, what. */
export function describeChange(trans: TranslationBundle, c: IChange): string {
  return trans.__(
    'Changed by %1 via %2 at %3: %4 (change %5)',
    c.user ?? trans.__('an unknown user'),
    c.via ?? trans.__('an unknown door'),
    new Date(c.time).toLocaleString(),
    c.action,
    c.id
  );
}

/** The cells a change touched, as its row lists them: `a (edited), b (inserted)`. */
export function changedCells(c: IChange): string {
  return c.cells
    .map(cell => `${cell.id ?? '?'} (${cell.what.join(', ')})`)
    .join(', ');
}

/** The banner of a notebook with unsaved edits that an agent changed on disk. */
export function changedOnDisk(
  trans: TranslationBundle,
  c: IChange | null
): string {
  if (!c) {
    return trans.__(
      'This notebook changed on disk while it has unsaved edits here.'
    );
  }
  return trans.__(
    '%1 changed this notebook on disk (change %2: %3) while it has unsaved edits here.',
    c.user ?? trans.__('An agent'),
    c.id,
    c.action
  );
}

/** Which cell a busy session runs, as the sessions list says it. */
export function runningCell(trans: TranslationBundle, s: ISession): string {
  const cell = s.running_cell;
  if (!cell) {
    return trans.__('starting');
  }
  if (s.notebook) {
    return trans.__('running cell %1', cell.cell_id ?? `#${cell.index + 1}`);
  }
  return cell.of
    ? trans.__('running cell %1 of %2', cell.index + 1, cell.of)
    : trans.__('running cell %1', cell.index + 1);
}

/** An error as the person reads it: the server's message, and each conflicting cell of a refused undo. */
export function readable(trans: TranslationBundle, error: unknown): string {
  if (!(error instanceof ApiError)) {
    return String(error);
  }
  if (error.status === 0) {
    return trans.__('The server cannot be reached: %1', error.message);
  }
  const conflicts: { id: string; what: string }[] | undefined =
    error.body?.conflicts;
  const lines = (conflicts ?? [])
    .map(c => trans.__('cell %1: %2', c.id, c.what))
    .filter(line => !error.message.includes(line));
  // (an undo's conflict names its cells; other 409s, e.g. a request decided already, are not undos)
  const head =
    error.status === 409 && conflicts ? trans.__('Cannot undo.') + ' ' : '';
  return [head + error.message, ...lines].join('\n');
}

/** What the panel says after an undo: which change it undid and, for an edit run since, whose outputs
 * it cleared (they came from the source undone). */
export function undone(
  trans: TranslationBundle,
  c: IChange,
  answer: { outputs_cleared?: string[] }
): string {
  const text = trans.__('Undid change %1 (%2) of %3.', c.id, c.action, c.path);
  const cleared = answer.outputs_cleared ?? [];
  if (!cleared.length) {
    return text;
  }
  const outputs = trans._n(
    'Cleared the outputs of cell %2: they came from the source this undid.',
    'Cleared the outputs of cells %2: they came from the source this undid.',
    cleared.length,
    cleared.join(', ')
  );
  return `${text} ${outputs}`;
}

/** What a changed cell shows: its source's unified diff, or its other parts before and after. */
export function cellDiffText(
  trans: TranslationBundle,
  cell: {
    diff?: string;
    before?: { [key: string]: any } | null;
    after?: { [key: string]: any } | null;
  }
): string {
  if (typeof cell.diff === 'string') {
    return cell.diff;
  }
  return [
    cell.before
      ? trans.__('before: %1', JSON.stringify(cell.before, null, 1))
      : '',
    cell.after ? trans.__('after: %1', JSON.stringify(cell.after, null, 1)) : ''
  ]
    .filter(Boolean)
    .join('\n');
}

/** A unified diff's lines with their kind: `added`, `removed` or `` (context, headers). */
export function diffLines(diff: string): [string, string][] {
  return diff
    .split('\n')
    .map(line => [
      line,
      line.startsWith('+') ? 'added' : line.startsWith('-') ? 'removed' : ''
    ]);
}

/** How long ago an ISO time was, roughly (`just now`, `3 min ago`, else the date). */
export function when(
  trans: TranslationBundle,
  iso: string,
  now = Date.now()
): string {
  const seconds = Math.max(0, (now - Date.parse(iso)) / 1000);
  if (seconds < 60) {
    return trans.__('just now');
  }
  if (seconds < 3600) {
    return trans.__('%1 min ago', Math.floor(seconds / 60));
  }
  return new Date(iso).toLocaleString();
}

/** The time since an ISO time, to the second (`42 s`, `2 min 5 s`). */
export function elapsed(
  trans: TranslationBundle,
  iso: string,
  now = Date.now()
): string {
  const seconds = Math.max(0, Math.floor((now - Date.parse(iso)) / 1000));
  const m = Math.floor(seconds / 60);
  return m
    ? trans.__('%1 min %2 s', m, seconds % 60)
    : trans.__('%1 s', seconds);
}
