import { ApiError, changeOfEvent, IChange, writtenNotebook } from '../api';
import {
  changedCells,
  changedOnDisk,
  describeChange,
  diffLines,
  elapsed,
  readable,
  runningCell,
  undone,
  when
} from '../format';
import { translation } from '../i18n';

const trans = translation(null);

const EVENTS = 'https://events.jupyter.org/jupyter_agent_tools/';

const change: IChange = {
  id: '26',
  time: '2026-12-04T10:00:00Z',
  path: 'a.ipynb',
  user: 'agent:analyst',
  via: 'mcp',
  kind: 'edit',
  action: 'edit 1 cell',
  undoes: null,
  undoable: true,
  cells: [
    { id: 'c1', what: ['edited'], index_before: 0, index_after: 0 },
    { id: null, what: ['inserted'], index_before: null, index_after: 1 }
  ]
};

describe('format', () => {
  it('describes a change: who, door, what, id', () => {
    const text = describeChange(trans, change);
    expect(text).toMatch(
      /^Changed by agent:analyst via mcp at .+: edit 1 cell \(change 26\)$/
    );
  });

  it('lists the cells a change touched', () => {
    expect(changedCells(change)).toBe('c1 (edited), ? (inserted)');
  });

  it('says who changed a notebook under unsaved edits', () => {
    expect(changedOnDisk(trans, change)).toBe(
      'agent:analyst changed this notebook on disk (change 26: edit 1 cell) while it has unsaved edits here.'
    );
    expect(changedOnDisk(trans, null)).toMatch(/changed on disk/);
  });

  it('says which cell a session runs', () => {
    const base = {
      name: 's',
      kernel_id: null,
      kernel_name: null,
      mode: 'session',
      notebook: null,
      state: 'busy',
      last_used: '',
      busy: true,
      queue_depth: 0,
      owner: null
    };
    expect(runningCell(trans, base)).toBe('starting');
    expect(
      runningCell(trans, { ...base, running_cell: { index: 1, of: 3 } })
    ).toBe('running cell 2 of 3');
    expect(
      runningCell(trans, {
        ...base,
        notebook: 'a.ipynb',
        running_cell: { index: 4, cell_id: 'wait' }
      })
    ).toBe('running cell wait');
  });

  it('says whose outputs an undo cleared (an edit run since)', () => {
    expect(undone(trans, change, { outputs_cleared: [] })).toBe(
      `Undid change 26 (${change.action}) of a.ipynb.`
    );
    expect(undone(trans, change, { outputs_cleared: ['total'] })).toBe(
      `Undid change 26 (${change.action}) of a.ipynb. Cleared the outputs of cell total: ` +
        'they came from the source this undid.'
    );
    expect(undone(trans, change, { outputs_cleared: ['a', 'b'] })).toContain(
      'Cleared the outputs of cells a, b:'
    );
  });

  it('reads a refused undo with each conflicting cell once', () => {
    const error = new ApiError(409, 'Change 3 cannot be undone.', {
      conflicts: [{ id: 'total', what: 'its source changed since' }]
    });
    expect(readable(trans, error)).toBe(
      'Cannot undo. Change 3 cannot be undone.\ncell total: its source changed since'
    );
    expect(readable(trans, new ApiError(0, 'TypeError: failed', null))).toBe(
      'The server cannot be reached: TypeError: failed'
    );
    // A 409 that is not a refused undo (a request decided already) is said as it is.
    const decided = new ApiError(
      409,
      'Approval 3 is already approved: it cannot be decided again.',
      { message: '...' }
    );
    expect(readable(trans, decided)).toBe(
      'Approval 3 is already approved: it cannot be decided again.'
    );
  });

  it('splits a diff into kinds of lines', () => {
    expect(diffLines('--- a\n+x\n-y\n z')).toEqual([
      ['--- a', 'removed'],
      ['+x', 'added'],
      ['-y', 'removed'],
      [' z', '']
    ]);
  });

  it('says times', () => {
    const now = Date.parse('2026-12-04T10:05:30Z');
    expect(when(trans, '2026-12-04T10:05:00Z', now)).toBe('just now');
    expect(when(trans, '2026-12-04T10:00:00Z', now)).toBe('5 min ago');
    expect(elapsed(trans, '2026-12-04T10:05:00Z', now)).toBe('30 s');
    expect(elapsed(trans, '2026-12-04T10:03:00Z', now)).toBe('2 min 30 s');
  });
});

describe('events', () => {
  it('reads a ledger entry from its event', () => {
    const event = {
      schema_id: `${EVENTS}ledger_change/v1`,
      change_id: 7,
      path: 'a.ipynb'
    };
    expect(changeOfEvent(event).id).toBe('7');
  });

  it('tells which notebook an event says was written', () => {
    expect(
      writtenNotebook({
        schema_id: `${EVENTS}notebook_change/v1`,
        path: 'a.ipynb'
      })
    ).toBe('a.ipynb');
    const step = {
      schema_id: `${EVENTS}session/v1`,
      mode: 'notebook',
      notebook: 'b.ipynb'
    };
    expect(writtenNotebook({ ...step, action: 'cell_started' })).toBe(
      'b.ipynb'
    );
    expect(writtenNotebook({ ...step, action: 'call_ended' })).toBe('b.ipynb');
    expect(writtenNotebook({ ...step, action: 'call_queued' })).toBeNull();
    expect(
      writtenNotebook({ ...step, mode: 'session', action: 'call_ended' })
    ).toBeNull();
    expect(
      writtenNotebook({ schema_id: `${EVENTS}refusal/v1`, path: 'x' })
    ).toBeNull();
  });
});
