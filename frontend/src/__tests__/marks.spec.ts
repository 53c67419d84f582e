/**
 * Cell marks drawn from the model's state on a real notebook panel (JupyterLab's notebook test
 * utilities: a notebook model in a mock context, its cells real widgets in jsdom).
 */
import {
  INotebookModel,
  NotebookPanel,
  NotebookTracker
} from '@jupyterlab/notebook';
import { NBTestUtils } from '@jupyterlab/notebook/lib/testutils';
import { Context } from '@jupyterlab/docregistry';

import {
  CHANGED_CLASS,
  CellMarks,
  PENDING_CLASS,
  RUNNING_CLASS
} from '../marks';
import { AgentModel } from '../model';
import {
  approval,
  change,
  changeEvent,
  FakeApi,
  FakeSource,
  session,
  settle
} from './fakes';

describe('CellMarks from the model', () => {
  let context: Context<INotebookModel>;
  let panel: NotebookPanel;
  let tracker: NotebookTracker;

  beforeEach(async () => {
    context = await NBTestUtils.createMockContext();
    panel = NBTestUtils.createNotebookPanel(context);
    NBTestUtils.populateNotebook(panel.content);
    tracker = new NotebookTracker({ namespace: 'test' });
    await tracker.add(panel);
  });

  afterEach(() => {
    panel.dispose();
    tracker.dispose();
    context.dispose();
  });

  it('marks the cell a change touched, the cell a run runs, the cells a request waits on', async () => {
    const path = context.path;
    const cells = panel.content.widgets;
    const [first, second, third] = cells;
    const api = new FakeApi();
    const source = new FakeSource();
    const model = new AgentModel(api, source);
    const marks = new CellMarks(tracker);
    marks.follow(model);
    await context.ready;
    await settle();
    expect(cells.some(c => c.node.classList.contains(CHANGED_CLASS))).toBe(
      false
    );

    // A change to the first cell, whose detail says the source it left: what the cell shows.
    const c = change('7', path, {
      cells: [
        {
          id: first.model.id,
          what: ['source'],
          index_before: 0,
          index_after: 0
        }
      ]
    });
    api.details.set('7', {
      ...c,
      cells: [
        {
          ...c.cells[0],
          before: { source: 'old' },
          after: { source: first.model.sharedModel.getSource() }
        }
      ]
    });
    source.event.emit(changeEvent(c));
    await settle();
    // Without collaboration the page shows the change once it loaded the file again (the follower
    // tells it): not before.
    expect(first.node.classList.contains(CHANGED_CLASS)).toBe(false);
    marks.synced(panel, marks.book.seq);
    expect(first.node.classList.contains(CHANGED_CLASS)).toBe(true);
    expect(first.node.dataset.agentChangeId).toBe('7');
    expect(first.node.title).toContain('agent:ci');
    expect(second.node.classList.contains(CHANGED_CLASS)).toBe(false);
    // The `marks` setting off: no change marked; on again: marked again.
    marks.enabled = false;
    expect(first.node.classList.contains(CHANGED_CLASS)).toBe(false);
    expect(first.node.dataset.agentChangeId).toBeUndefined();
    marks.enabled = true;
    expect(first.node.classList.contains(CHANGED_CLASS)).toBe(true);

    // A notebook run at the second cell.
    api.sessionList = [
      session('nb', {
        mode: 'notebook',
        notebook: path,
        busy: true,
        running_cell: { index: 1, cell_id: second.model.id }
      })
    ];
    await model.loadSessions();
    expect(second.node.classList.contains(RUNNING_CLASS)).toBe(true);
    api.sessionList = [];
    await model.loadSessions();
    expect(second.node.classList.contains(RUNNING_CLASS)).toBe(false);

    // A request to edit the third cell: marked until decided.
    api.pending = [
      approval(3, {
        action: 'edit',
        path,
        details: { edit: { cells: [{ id: third.model.id, source: 'x' }] } }
      })
    ];
    await model.loadApprovals();
    expect(third.node.classList.contains(PENDING_CLASS)).toBe(true);
    expect(third.node.dataset.agentApprovalId).toBe('3');
    source.event.emit({
      schema_id: 'https://events.jupyter.org/jupyter_agent_tools/approval/v1',
      event: 'denied',
      approval_id: 3
    });
    expect(third.node.classList.contains(PENDING_CLASS)).toBe(false);

    // The person edits the changed cell: the mark goes.
    first.model.sharedModel.setSource('the person typed this');
    marks.refresh(panel);
    expect(first.node.classList.contains(CHANGED_CLASS)).toBe(false);

    marks.dispose();
    model.dispose();
  });
});
