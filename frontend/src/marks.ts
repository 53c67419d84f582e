/**
 * Marks on the cells of open notebooks: a cell an agent changed carries the class `jp-agent-changed`,
 * a tooltip (who, via which door, when, which change) and `data-agent-change-id` while the mark is true
 * (see `MarkBook`); the cell a notebook run is running carries `jp-agent-running`; a cell an agent's
 * request waits to run or edit carries `jp-agent-pending` and `data-agent-approval-id` until it is decided.
 */
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import {
  DisposableDelegate,
  DisposableSet,
  IDisposable
} from '@lumino/disposable';
import { Signal } from '@lumino/signaling';

import { IChange } from './api';
import { pendingCells } from './approvals';
import { describeChange } from './format';
import { nullTranslator, TranslationBundle } from '@jupyterlab/translation';
import { DOMAIN } from './i18n';
import { MarkBook, sourcesAfter } from './markbook';
import { IAgentModel } from './agentModel';

export const CHANGED_CLASS = 'jp-agent-changed';
export const RUNNING_CLASS = 'jp-agent-running';
export const PENDING_CLASS = 'jp-agent-pending';
const DISMISS_CLASS = 'jp-agent-changed-dismiss';

export class CellMarks implements IDisposable {
  constructor(
    private readonly tracker: INotebookTracker,
    private readonly trans: TranslationBundle = nullTranslator.load(DOMAIN),
    readonly book = new MarkBook()
  ) {
    tracker.widgetAdded.connect(this._onAdded, this);
    tracker.forEach(panel => this._watch(panel));
  }

  /** Whether changes mark cells (the `marks` setting). */
  get enabled(): boolean {
    return this._enabled;
  }

  set enabled(value: boolean) {
    this._enabled = value;
    this.tracker.forEach(panel => this.refresh(panel));
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this.tracker.widgetAdded.disconnect(this._onAdded, this);
    Signal.clearData(this);
    for (const watched of this._watched.values()) {
      watched.dispose();
    }
    this._watched.clear();
  }

  /**
   * Mark the changes `model` is told. An open notebook's marks wait for the sources the change left
   * (its detail): a mark is drawn on a cell only when the cell shows them. The cell each notebook run
   * runs, and the cells requests wait to run or edit, are marked too.
   */
  follow(model: IAgentModel): void {
    model.recorded.connect((_, change) => {
      const open = this._enabled && this.isOpen(change.path);
      this.changed(change, describeChange(this.trans, change), open);
      if (open) {
        model
          .detail(change)
          .then(detail => sourcesAfter(detail))
          .catch(() => null)
          .then(sources => this.expect(change.path, change.id, sources));
      }
    }, this);
    model.running.connect((_, { path, cellId }) => this.running(path, cellId));
    let marked = model.approvals; // (a new list each time it changes)
    model.stateChanged.connect(() => {
      if (model.approvals !== marked) {
        marked = model.approvals;
        this.pending(pendingCells(marked));
      }
    }, this);
  }

  /** A recorded change; `pending`: its sources will be told through `expect`. */
  changed(change: IChange, tooltip: string, pending: boolean): void {
    this.book.record(change, tooltip, pending);
    this.refreshPath(change.path);
  }

  /** The sources change `changeId` of `path` left (null: unknown). */
  expect(
    path: string,
    changeId: string,
    sources: Map<string, string> | null
  ): void {
    this.book.expect(path, changeId, sources);
    this.refreshPath(path);
  }

  /** The cell a notebook run is running in `path` (null: none). */
  running(path: string, cellId: string | null): void {
    if (cellId === null) {
      this._running.delete(path);
    } else {
      this._running.set(path, cellId);
    }
    this.refreshPath(path);
  }

  /** The cells waiting for a decision: by notebook path, cell id -> the request's id (`pendingCells`). */
  pending(cells: Map<string, Map<string, number>>): void {
    const paths = new Set([...this._pending.keys(), ...cells.keys()]);
    this._pending = cells;
    for (const path of paths) {
      this.refreshPath(path);
    }
  }

  /** Whether `path` is open in a page of this application. */
  isOpen(path: string): boolean {
    return (
      this.tracker.find(panel => panel.context.path === path) !== undefined
    );
  }

  /** A view of a notebook without collaboration now shows the file as it is (loaded or reverted). */
  synced(panel: NotebookPanel, seq: number): void {
    this._synced.set(panel, seq);
    this.refresh(panel);
  }

  refreshPath(path: string): void {
    this.tracker.forEach(panel => {
      if (panel.context.path === path) {
        this.refresh(panel);
      }
    });
  }

  refresh(panel: NotebookPanel): void {
    if (panel.isDisposed || !panel.content.model) {
      return;
    }
    const path = panel.context.path;
    const running = this._running.get(path);
    const pending = this._pending.get(path);
    // A collaborative view is the live document: it shows every change as it arrives.
    const synced = panel.content.model.collaborative
      ? Infinity
      : (this._synced.get(panel) ?? 0);
    for (const cell of panel.content.widgets) {
      const id = cell.model.id;
      const mark =
        this._enabled && this.book.has(path, id)
          ? this.book.mark(path, id, cell.model.sharedModel.getSource(), synced)
          : null;
      const node = cell.node;
      node.classList.toggle(RUNNING_CLASS, id === running);
      const approvalId = pending?.get(id);
      node.classList.toggle(PENDING_CLASS, approvalId !== undefined);
      if (approvalId !== undefined) {
        node.dataset.agentApprovalId = String(approvalId);
      } else if (node.dataset.agentApprovalId) {
        delete node.dataset.agentApprovalId;
      }
      let dismiss = node.querySelector(`:scope > .${DISMISS_CLASS}`);
      if (mark) {
        node.classList.add(CHANGED_CLASS);
        node.title = mark.tooltip;
        node.dataset.agentChangeId = mark.changeId;
        if (!dismiss) {
          dismiss = document.createElement('button');
          dismiss.className = DISMISS_CLASS;
          dismiss.textContent = '\u00d7';
          const label = this.trans.__('Dismiss the agent mark');
          dismiss.setAttribute('title', label);
          dismiss.setAttribute('aria-label', label);
          node.appendChild(dismiss);
        }
      } else if (node.classList.contains(CHANGED_CLASS)) {
        node.classList.remove(CHANGED_CLASS);
        node.removeAttribute('title');
        delete node.dataset.agentChangeId;
        dismiss?.remove();
      }
    }
  }

  private _onAdded(_: INotebookTracker, panel: NotebookPanel): void {
    this._watch(panel);
  }

  private _watch(panel: NotebookPanel): void {
    if (this._watched.has(panel)) {
      return;
    }
    const connections = new DisposableSet();
    this._watched.set(panel, connections);
    const refresh = () => this.refresh(panel);
    panel.context.ready
      .then(() => {
        // Loaded from disk now: it shows every change recorded so far.
        this._synced.set(panel, this.book.seq);
        refresh();
      })
      .catch(() => undefined);
    // A cell's source changes (the person's edit, a reload): the marks are checked against it. A cell's
    // widget is made by the notebook's own handler of its model's `cells.changed`, after
    // `modelContentChanged`: a mark for a cell arriving now is drawn by this later handler.
    const notebook = panel.content;
    notebook.modelContentChanged.connect(refresh);
    connections.add(
      new DisposableDelegate(() =>
        notebook.modelContentChanged.disconnect(refresh)
      )
    );
    let cells: NotebookPanel['content']['model'] = null;
    const watchCells = () => {
      cells?.cells.changed.disconnect(refresh);
      cells = notebook.model;
      cells?.cells.changed.connect(refresh);
    };
    watchCells();
    notebook.modelChanged.connect(watchCells);
    connections.add(
      new DisposableDelegate(() => {
        notebook.modelChanged.disconnect(watchCells);
        cells?.cells.changed.disconnect(refresh);
      })
    );
    const onClick = (event: MouseEvent) => {
      const target = event.target as HTMLElement;
      if (target.classList?.contains(DISMISS_CLASS)) {
        const cell = notebook.widgets.find(c => c.node.contains(target));
        if (cell) {
          this.book.dismiss(panel.context.path, cell.model.id);
          refresh();
        }
        event.stopPropagation();
      }
    };
    notebook.node.addEventListener('click', onClick);
    connections.add(
      new DisposableDelegate(() =>
        notebook.node.removeEventListener('click', onClick)
      )
    );
    panel.disposed.connect(() => {
      connections.dispose();
      this._watched.delete(panel);
    });
  }

  private _enabled = true;
  private _disposed = false;
  private _running = new Map<string, string>();
  private _pending = new Map<string, Map<string, number>>();
  private _synced = new WeakMap<NotebookPanel, number>();
  private _watched = new Map<NotebookPanel, DisposableSet>();
}
