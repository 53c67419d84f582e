import { IChange } from '../api';
import { isOverwrite, MarkBook, sourcesAfter } from '../markbook';

function edit(
  id: string,
  cells: [string, string][],
  extra: Partial<IChange> = {}
): IChange {
  return {
    id,
    time: '2026-12-04T10:00:00Z',
    path: 'a.ipynb',
    user: 'agent:x',
    via: 'http',
    kind: 'edit',
    action: 'edit',
    undoes: null,
    undoable: true,
    cells: cells.map(([cellId, what]) => ({
      id: cellId,
      what: [what],
      index_before: 0,
      index_after: 0
    })),
    ...extra
  };
}

const LIVE = Infinity;

describe('MarkBook', () => {
  it('draws a mark only where the cell shows what the change left', () => {
    const book = new MarkBook();
    book.record(edit('1', [['c', 'edited']]), 'tip', true);
    // Its sources are not known yet: not drawn.
    expect(book.mark('a.ipynb', 'c', 'old', LIVE)).toBeNull();
    book.expect('a.ipynb', '1', new Map([['c', 'new']]));
    // The view still shows the old source (the room's update is on its way): not drawn.
    expect(book.mark('a.ipynb', 'c', 'old', LIVE)).toBeNull();
    expect(book.has('a.ipynb', 'c')).toBe(true);
    const mark = book.mark('a.ipynb', 'c', 'new', LIVE);
    expect(mark?.changeId).toBe('1');
    expect(mark?.tooltip).toBe('tip');
  });

  it('forgets a drawn mark once the cell is edited', () => {
    const book = new MarkBook();
    book.record(edit('1', [['c', 'edited']]), 'tip', true);
    book.expect('a.ipynb', '1', new Map([['c', 'new']]));
    expect(book.mark('a.ipynb', 'c', 'new', LIVE)).not.toBeNull();
    expect(book.mark('a.ipynb', 'c', 'new # mine', LIVE)).toBeNull();
    expect(book.has('a.ipynb', 'c')).toBe(false);
    // Typing the agent's text back does not bring it back.
    expect(book.mark('a.ipynb', 'c', 'new', LIVE)).toBeNull();
  });

  it('does not draw on a view loaded before the change (stale)', () => {
    const book = new MarkBook();
    const synced = book.seq; // a page that loaded the file before the change
    book.record(edit('1', [['c', 'outputs']]), 'tip', false);
    expect(book.mark('a.ipynb', 'c', 'x = 1', synced)).toBeNull();
    // Reloaded after it: drawn, with the source it shows then as the one to keep.
    expect(book.mark('a.ipynb', 'c', 'x = 1', book.seq)).not.toBeNull();
    expect(book.mark('a.ipynb', 'c', 'x = 2', book.seq)).toBeNull();
  });

  it('forgets the marks of an undone or overwritten change', () => {
    const book = new MarkBook();
    book.record(edit('1', [['c', 'edited']]), 'tip', false);
    book.record(edit('2', [['d', 'inserted']]), 'tip', false);
    book.record(
      edit('3', [['c', 'edited']], { kind: 'undo', undoes: '1' }),
      'undo',
      false
    );
    expect(book.has('a.ipynb', 'c')).toBe(false);
    expect(book.has('a.ipynb', 'd')).toBe(true);
    const overwrite = edit('4', [['d', 'deleted']], {
      kind: 'overwrite',
      user: 'person',
      overwrites: ['2']
    });
    expect(isOverwrite(overwrite)).toBe(true);
    book.record(overwrite, 'save', false);
    expect(book.has('a.ipynb', 'd')).toBe(false);
  });

  it('drops marks of deleted cells and of dismissed ones', () => {
    const book = new MarkBook();
    book.record(
      edit('1', [
        ['c', 'inserted'],
        ['e', 'edited']
      ]),
      'tip',
      false
    );
    book.record(edit('2', [['c', 'deleted']]), 'tip', false);
    expect(book.has('a.ipynb', 'c')).toBe(false);
    book.dismiss('a.ipynb', 'e');
    expect(book.has('a.ipynb', 'e')).toBe(false);
  });

  it('reads the sources a change left from its detail', () => {
    const sources = sourcesAfter({
      cells: [
        { id: 'a', after: { source: 'x = 1' } },
        { id: 'b', after: { outputs: [] } },
        { id: 'c', after: null },
        { id: null, after: { source: 'no id' } }
      ]
    });
    expect([...sources]).toEqual([['a', 'x = 1']]);
  });
});
