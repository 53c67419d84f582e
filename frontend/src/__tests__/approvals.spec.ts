// (expected values: what the null translator gives)
/* eslint-disable jupyter/no-untranslated-string */
import { IApproval } from '../api';
import {
  APPROVAL_URL_PATTERN,
  approvalInUrl,
  asked,
  beyondBox,
  notebookOf,
  notShown,
  PendingBook,
  pendingCells,
  shown,
  unshownCount,
  visibleParts
} from '../approvals';
import { ReactWidget } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';
import * as React from 'react';

import { ApprovalDetails } from '../lists';
import { drawn } from './fakes';
import { translation } from '../i18n';

const trans = translation(null);

/** What the panel shows of a request (the component, drawn into a widget's node). */
async function approvalNode(
  trans: TranslationBundle,
  approval: IApproval
): Promise<HTMLElement> {
  const widget = ReactWidget.create(
    React.createElement(ApprovalDetails, { trans, approval })
  );
  Widget.attach(widget, document.body);
  await drawn();
  return widget.node.firstElementChild as HTMLElement;
}

function request(
  id: number,
  details: { [key: string]: any } = {},
  extra: Partial<IApproval> = {}
): IApproval {
  return {
    id,
    agent: 'agent:ci-bot',
    door: 'http',
    action: 'execute',
    path: null,
    summary: "run 1 cell in session 's'",
    state: 'pending',
    created: '2026-12-05T10:00:00Z',
    expires: '2026-12-05T10:10:00Z',
    decided_by: null,
    decided: null,
    reason: null,
    for_seconds: null,
    details,
    ...extra
  };
}

const ids = (book: PendingBook) => book.items.map(a => a.id);

describe('PendingBook', () => {
  it('lists requests oldest first and drops decided ones', () => {
    const book = new PendingBook();
    book.reading();
    book.listed([request(3), request(1)]);
    expect(ids(book)).toEqual([1, 3]);
    expect(book.add(request(2))).toBe(true);
    expect(book.add(request(2))).toBe(false); // told twice
    expect(ids(book)).toEqual([1, 2, 3]);
    expect(book.remove(1)).toBe(true);
    expect(book.remove(1)).toBe(false);
    expect(ids(book)).toEqual([2, 3]);
    expect(book.get(3)?.id).toBe(3);
  });

  it('keeps a request told while the list was read, and not one decided meanwhile', () => {
    const book = new PendingBook();
    book.reading();
    // While the list is read: request 5 arrives, request 4 is decided.
    book.add(request(5));
    book.remove(4);
    book.listed([request(4)]); // the answer predates both
    expect(ids(book)).toEqual([5]);
  });

  it('never lists a decided request again (a late event or read)', () => {
    const book = new PendingBook();
    book.remove(7); // its decision arrived before its details were read
    expect(book.add(request(7))).toBe(false);
    book.reading();
    book.listed([request(7)]);
    expect(ids(book)).toEqual([]);
    expect(book.add(request(8, {}, { state: 'approved' }))).toBe(false);
  });

  it('a new read replaces what the last one said', () => {
    const book = new PendingBook();
    book.reading();
    book.listed([request(1), request(2)]);
    book.reading();
    book.listed([request(2)]); // 1 expired while the page was not listening
    expect(ids(book)).toEqual([2]);
  });
});

describe('what a request shows', () => {
  it('says who wants what', () => {
    const a = request(1, {}, { summary: 'run 2 cells in report.ipynb' });
    expect(asked(trans, a)).toBe(
      'agent:ci-bot wants to run 2 cells in report.ipynb'
    );
  });

  it("shows an eval's code, cell by cell", () => {
    const a = request(1, {
      cells: [
        { code: 'x = 1', title: null },
        { code: 'print(x)', title: 'show' }
      ]
    });
    expect(shown(trans, a)).toEqual([
      { title: 'cell 1', text: 'x = 1', diff: false },
      { title: 'show', text: 'print(x)', diff: false }
    ]);
  });

  it("shows a run's cells as they would run, and an edit's diff", () => {
    const run = request(1, {
      path: 'r.ipynb',
      cells: [
        { id: 'a', index: 0, source: 'x = 1', source_hash: 'h' },
        { id: 'b', index: 1, source: 'y = 2', new: true }
      ]
    });
    expect(shown(trans, run)).toEqual([
      { title: 'cell a', text: 'x = 1', diff: false },
      { title: 'cell b (new)', text: 'y = 2', diff: false }
    ]);
    const edit = request(2, {
      path: 'r.ipynb',
      cells: [
        { id: 'a', what: ['edited'], diff: '-x = 1\n+x = 2' },
        { id: 'c', what: ['metadata'], before: { m: 1 }, after: { m: 2 } }
      ]
    });
    expect(shown(trans, edit)).toEqual([
      { title: 'cell a: edited', text: '-x = 1\n+x = 2', diff: true },
      {
        title: 'cell c: metadata',
        text: 'before: {\n "m": 1\n}\nafter: {\n "m": 2\n}',
        diff: false
      }
    ]);
  });

  it("shows a run's ops as a diff before the cells it runs", () => {
    const run = request(1, {
      path: 'r.ipynb',
      actions: ['execute', 'edit'],
      edit: {
        summary: 'deleted 1 cell, edited 1 cell',
        cells: [
          { id: 'a', what: ['deleted'], diff: '-x = 1' },
          { id: 'b', what: ['edited'], diff: '-y = 2\n+y = 3' }
        ]
      },
      cells: [{ id: 'b', index: 0, source: 'y = 3', source_hash: 'h' }]
    });
    expect(shown(trans, run)).toEqual([
      { title: 'cell a: deleted', text: '-x = 1', diff: true },
      { title: 'cell b: edited', text: '-y = 2\n+y = 3', diff: true },
      { title: 'cell b', text: 'y = 3', diff: false }
    ]);
    expect([...pendingCells([run]).get('r.ipynb')!.keys()]).toEqual(['b', 'a']);
  });

  it("shows the change an undo undoes, and a kernel action's body", () => {
    const undo = request(1, {
      path: 'r.ipynb',
      change: { id: '4', cells: [{ id: 'a', what: ['edited'], diff: '+z' }] }
    });
    expect(shown(trans, undo)).toEqual([
      { title: 'cell a: edited', text: '+z', diff: true }
    ]);
    const kernel = request(2, { path: 'r.ipynb', body: { action: 'restart' } });
    expect(shown(trans, kernel)).toEqual([
      { title: '', text: '{\n "action": "restart"\n}', diff: false }
    ]);
  });

  it('names the notebook without the leading slash of a route', () => {
    expect(notebookOf(request(1, {}, { path: '/dir/r.ipynb' }))).toBe(
      'dir/r.ipynb'
    );
    expect(notebookOf(request(1))).toBeNull();
  });
});

describe('pendingCells', () => {
  it('marks the cells a run or an edit waits on, by notebook and cell id', () => {
    const run = request(
      1,
      {
        path: 'r.ipynb',
        cells: [
          { id: 'a', source: 'x' },
          { id: 'n', source: 'y', new: true } // not in the notebook yet
        ]
      },
      { path: '/r.ipynb' }
    );
    const edit = request(2, {
      path: 'r.ipynb',
      cells: [
        { id: 'a', what: ['edited'] },
        { id: 'b', what: ['deleted'] }
      ]
    });
    const evalCode = request(3, { cells: [{ code: 'x' }] });
    const marks = pendingCells([run, edit, evalCode]);
    expect([...marks.keys()]).toEqual(['r.ipynb']);
    expect([...marks.get('r.ipynb')!]).toEqual([
      ['a', 1], // the oldest request's
      ['b', 2]
    ]);
  });
});

describe('approvalInUrl', () => {
  it('reads the request a URL opens JupyterLab at', () => {
    expect(approvalInUrl('?agent-approval=12')).toBe(12);
    expect(approvalInUrl('?reset&agent-approval=3')).toBe(3);
    expect(approvalInUrl('?agent-approval=x')).toBeNull();
    expect(approvalInUrl('?agent-approval=')).toBeNull();
    expect(approvalInUrl('')).toBeNull();
  });

  it('is what the router routes', () => {
    expect(APPROVAL_URL_PATTERN.test('/lab?agent-approval=12')).toBe(true);
    expect(
      APPROVAL_URL_PATTERN.test('/lab/tree/a.ipynb?x=1&agent-approval=7')
    ).toBe(true);
    expect(APPROVAL_URL_PATTERN.test('/lab?my-agent-approval=7')).toBe(false);
    expect(APPROVAL_URL_PATTERN.test('/lab/tree/agent-approval=7')).toBe(false);
  });
});

describe("what the person is shown of an agent's text", () => {
  const trojan =
    'ok()\rrm_all()\n\x1b[2Kif user\u202e\u2066 == admin\u2069\u202c:\u200b\tgo()';

  it('marks control, bidirectional and invisible characters as escapes', () => {
    const parts = visibleParts(trojan);
    const escaped = parts.filter(([, marked]) => marked).map(([p]) => p);
    expect(escaped).toEqual([
      '\\r',
      '\\x1b',
      '\\u202e',
      '\\u2066',
      '\\u2069',
      '\\u202c',
      '\\u200b'
    ]);
    const joined = parts.map(([p]) => p).join('');
    expect(joined).toBe(
      'ok()\\rrm_all()\n\\x1b[2Kif user\\u202e\\u2066 == admin\\u2069\\u202c:\\u200b\tgo()'
    );
    expect(unshownCount(trojan)).toBe(7);
    expect(visibleParts('plain\tcode\n')).toEqual([['plain\tcode\n', false]]);
  });

  it('never puts such a character in the panel, and says how many were marked', async () => {
    const node = await approvalNode(
      trans,
      request(1, { cells: [{ code: trojan }] })
    );
    const text = node.textContent ?? '';
    for (const raw of [
      '\r',
      '\x1b',
      '\u202e',
      '\u2066',
      '\u2069',
      '\u202c',
      '\u200b'
    ]) {
      expect(text).not.toContain(raw);
    }
    expect(node.querySelectorAll('.jp-AgentActivity-control')).toHaveLength(7);
    expect(text).toContain(
      '7 control or invisible characters are shown as marked escapes'
    );
  });

  it('says when code is longer or wider than its box', async () => {
    expect(beyondBox(trans, 'a = 1\nb = 2')).toBe('');
    const long = Array.from({ length: 40 }, (_, i) => `x${i} = ${i}`).join(
      '\n'
    );
    expect(beyondBox(trans, long)).toBe(
      '40 lines, the longest 8 characters: scroll the box to read it all'
    );
    expect(beyondBox(trans, 'x'.repeat(500))).toContain(
      'the longest 500 characters'
    );
    const node = await approvalNode(
      trans,
      request(1, { cells: [{ code: long }] })
    );
    expect(
      node.querySelector('.jp-AgentActivity-beyond')?.textContent
    ).toContain('40 lines');
  });

  it('warns when the server cut the request, or only a preview is read', async () => {
    expect(notShown(trans, request(1))).toBe('');
    expect(notShown(trans, request(1, {}, { truncated: 8000000 }))).toContain(
      '8000000 bytes of what it would do are not shown'
    );
    expect(notShown(trans, request(1, {}, { preview: true }))).toContain(
      'Only a preview'
    );
    const node = await approvalNode(
      trans,
      request(1, { cells: [{ code: 'x' }] }, { truncated: 5 })
    );
    expect(
      node.querySelector('.jp-AgentActivity-notShown')?.textContent
    ).toContain('5 bytes');
  });

  it('shows where and how an eval runs', () => {
    const parts = shown(
      trans,
      request(1, {
        cells: [{ code: 'import os', title: null }],
        session: 's',
        cwd: '/srv',
        env: { A: '1' },
        reset: true
      })
    );
    expect(parts[0].title).toBe('runs with');
    expect(parts[0].text).toBe(
      'session: "s"\ncwd: "/srv"\nenv: {"A":"1"}\nreset: true'
    );
    expect(parts[1].text).toBe('import os');
  });

  it("keeps a request read in full over the list's preview of it", () => {
    const book = new PendingBook();
    book.reading();
    book.listed([request(1, { cells: [] }, { preview: true })]);
    expect(book.full(request(1, { cells: [{ code: 'all of it' }] }))).toBe(
      true
    );
    expect(book.get(1)?.preview).toBeUndefined();
    book.reading();
    book.listed([request(1, { cells: [] }, { preview: true })]); // a later read: still the full one
    expect(book.get(1)?.details?.cells[0].code).toBe('all of it');
    expect(book.full(request(2))).toBe(false); // not listed
  });
});
