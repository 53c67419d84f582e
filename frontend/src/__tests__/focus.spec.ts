/**
 * The pure parts of "Share my focus": the tab id, whom it is shared with, the selected text, the body's
 * bound, and which focus events a tab acts on.
 */
import {
  eventFor,
  fitBody,
  FOCUS_EVENT,
  IFocusBody,
  makeTabId,
  parseAgents,
  selectionText,
  describeAction
} from '../focus';

describe('makeTabId', () => {
  it('makes ids the server accepts, different each time', () => {
    const a = makeTabId();
    expect(a).toMatch(/^[A-Za-z0-9_-]{8,64}$/);
    expect(makeTabId()).not.toEqual(a);
    expect(makeTabId(() => 0)).toBe('tab-0000000000000000');
  });
});

describe('parseAgents', () => {
  it('is every agent when empty or "all"', () => {
    expect(parseAgents('')).toBe('all');
    expect(parseAgents('  all ')).toBe('all');
  });
  it('splits names on commas and spaces, once each', () => {
    expect(parseAgents('claude, codex  claude')).toEqual(['claude', 'codex']);
  });
});

describe('selectionText', () => {
  const source = 'df = load()\ndf.plot()\nprint(df)';
  it('takes the text between two positions, in either order', () => {
    expect(
      selectionText(source, { line: 1, column: 3 }, { line: 1, column: 7 })
    ).toBe('plot');
    expect(
      selectionText(source, { line: 2, column: 5 }, { line: 0, column: 5 })
    ).toBe('load()\ndf.plot()\nprint');
  });
  it('is empty for a cursor, and bounded by the source', () => {
    expect(
      selectionText(source, { line: 0, column: 2 }, { line: 0, column: 2 })
    ).toBe('');
    expect(
      selectionText(source, { line: 2, column: 0 }, { line: 9, column: 99 })
    ).toBe('print(df)');
  });
});

describe('fitBody', () => {
  const body = (image: string): IFocusBody => ({
    agents: 'all',
    path: 'a.ipynb',
    cell: {
      id: 'c1',
      index: 0,
      cell_type: 'code',
      source: 'x',
      execution_count: 1,
      outputs: [
        {
          output_type: 'display_data',
          data: { 'image/png': image, 'text/plain': '<Figure>' },
          metadata: {}
        }
      ]
    },
    selection: null,
    kernel: null
  });
  it('keeps a small body as it is', () => {
    const small = body('iVBOR');
    expect(fitBody(small, 1000)).toBe(small);
  });
  it('drops the data of outputs but their text when too large, then the outputs', () => {
    const fitted = fitBody(body('A'.repeat(5000)), 1000);
    expect(fitted.cell!.outputs[0].data).toEqual({ 'text/plain': '<Figure>' });
    expect(fitBody(body('A'.repeat(5000)), 100).cell!.outputs).toEqual([]);
  });
});

describe('eventFor', () => {
  const tab = 'tab-1234567890abcdef';
  const action = (extra: object) => ({
    schema_id: FOCUS_EVENT,
    event: 'action',
    user: 'agent:helper',
    action: 'reveal_cell',
    path: 'a.ipynb',
    cell_id: 'c1',
    ...extra
  });
  it('does an action addressed to this tab, offers one addressed to none', () => {
    expect(eventFor(action({ tab }) as any, tab)?.kind).toBe('do');
    expect(eventFor(action({ tab: null }) as any, tab)?.kind).toBe('offer');
    expect(eventFor(action({ tab: 'tab-other000000' }) as any, tab)).toBeNull();
  });
  it('never takes an action outside the allow-list', () => {
    const run = action({ tab, action: 'terminal:create-new' });
    expect(eventFor(run as any, tab)).toBeNull();
  });
  it("tells when an agent read this tab's focus, not another's", () => {
    const read = {
      schema_id: FOCUS_EVENT,
      event: 'read',
      user: 'agent:helper'
    };
    expect(eventFor({ ...read, tab } as any, tab)).toEqual({
      kind: 'read',
      agent: 'agent:helper'
    });
    expect(eventFor({ ...read, tab: 'tab-x0000000' } as any, tab)).toBeNull();
    expect(eventFor({ schema_id: 'other', tab } as any, tab)).toBeNull();
  });
  it('describes an action in a line', () => {
    expect(describeAction(action({ tab }) as any)).toBe(
      'agent:helper points at cell c1 of a.ipynb'
    );
  });
});
