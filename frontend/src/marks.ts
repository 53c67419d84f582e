/**
 * Marks on the cells of open notebooks: a cell an agent changed (a change-ledger entry) carries the
 * class `jp-agent-changed` and a tooltip (who, via which door, when) until the person edits it or
 * dismisses the mark; the cell a notebook run is running carries `jp-agent-running`.
 */
import { Cell } from '@jupyterlab/cells';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

import { IChange } from './api';
import { trans } from './i18n';

export const CHANGED_CLASS = 'jp-agent-changed';
export const RUNNING_CLASS = 'jp-agent-running';
const DISMISS_CLASS = 'jp-agent-changed-dismiss';

interface IMark {
  changeId: string;
  tooltip: string;
}

/** Keys that change an editor's text (a person's edit ends the mark). */
const EDITING_KEYS = new Set(['Backspace', 'Delete', 'Enter', 'Tab']);

export class CellMarks {
  constructor(private readonly tracker: INotebookTracker) {
    tracker.widgetAdded.connect((_, panel) => this._watch(panel));
    tracker.forEach(panel => this._watch(panel));
  }

  /** Whether changes mark cells (the `marks` setting). */
  get enabled(): boolean {
    return this._enabled;
  }

  set enabled(value: boolean) {
    this._enabled = value;
    this._refreshAll();
  }

  /** A recorded change: mark the cells it left in place (inserted or changed). */
  changed(change: IChange, tooltip: string): void {
    let marks = this._marks.get(change.path);
    if (!marks) {
      marks = new Map();
      this._marks.set(change.path, marks);
    }
    for (const cell of change.cells) {
      if (!cell.id) {
        continue;
      }
      if (cell.what.includes('deleted')) {
        marks.delete(cell.id);
      } else {
        marks.set(cell.id, { changeId: change.id, tooltip });
      }
    }
    this._refreshPath(change.path);
  }

  /** The cell a notebook run is running in `path` (null: none). */
  running(path: string, cellId: string | null): void {
    if (cellId === null) {
      this._running.delete(path);
    } else {
      this._running.set(path, cellId);
    }
    this._refreshPath(path);
  }

  /** Forget the mark of a cell (edited or dismissed). */
  dismiss(path: string, cellId: string): void {
    this._marks.get(path)?.delete(cellId);
    this._refreshPath(path);
  }

  private _watch(panel: NotebookPanel): void {
    const refresh = () => this._refresh(panel);
    panel.context.ready.then(refresh).catch(() => undefined);
    panel.content.modelContentChanged.connect(refresh);
    // A cell's widget is made by the notebook's own handler of its model's `cells.changed`, after the
    // model told `modelContentChanged`: a mark already known for a cell arriving now (the ledger's event
    // came before the room's update) is drawn by this later handler, connected after the notebook's.
    const watchCells = () =>
      panel.content.model?.cells.changed.connect(refresh);
    watchCells();
    panel.content.modelChanged.connect(watchCells);
    panel.content.node.addEventListener('keydown', event => {
      if (
        event.key.length === 1 ||
        EDITING_KEYS.has(event.key) ||
        event.ctrlKey ||
        event.metaKey
      ) {
        this._edited(panel, event);
      }
    });
    for (const type of ['paste', 'cut', 'drop']) {
      panel.content.node.addEventListener(type, event =>
        this._edited(panel, event)
      );
    }
    panel.content.node.addEventListener('click', event => {
      const target = event.target as HTMLElement;
      if (target.classList?.contains(DISMISS_CLASS)) {
        const cell = this._cellOf(panel, target);
        if (cell) {
          this.dismiss(panel.context.path, cell.model.id);
        }
        event.stopPropagation();
      }
    });
  }

  private _edited(panel: NotebookPanel, event: Event): void {
    const target = event.target as HTMLElement;
    if (!target.closest?.('.jp-InputArea-editor')) {
      return; // typed in command mode or an output, not into a cell's source
    }
    const cell = this._cellOf(panel, target);
    if (cell && this._marks.get(panel.context.path)?.has(cell.model.id)) {
      this.dismiss(panel.context.path, cell.model.id);
    }
  }

  private _cellOf(panel: NotebookPanel, node: HTMLElement): Cell | undefined {
    return panel.content.widgets.find(cell => cell.node.contains(node));
  }

  private _refreshAll(): void {
    this.tracker.forEach(panel => this._refresh(panel));
  }

  private _refreshPath(path: string): void {
    this.tracker.forEach(panel => {
      if (panel.context.path === path) {
        this._refresh(panel);
      }
    });
  }

  private _refresh(panel: NotebookPanel): void {
    if (panel.isDisposed || !panel.content.model) {
      return;
    }
    const marks = this._marks.get(panel.context.path);
    const running = this._running.get(panel.context.path);
    for (const cell of panel.content.widgets) {
      const mark = this._enabled ? marks?.get(cell.model.id) : undefined;
      const node = cell.node;
      node.classList.toggle(RUNNING_CLASS, cell.model.id === running);
      let dismiss = node.querySelector(`:scope > .${DISMISS_CLASS}`);
      if (mark) {
        node.classList.add(CHANGED_CLASS);
        node.title = mark.tooltip;
        node.dataset.agentChangeId = mark.changeId;
        if (!dismiss) {
          dismiss = document.createElement('button');
          dismiss.className = DISMISS_CLASS;
          dismiss.textContent = '\u00d7';
          const label = trans.__('Dismiss the agent mark');
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

  private _enabled = true;
  private _marks = new Map<string, Map<string, IMark>>();
  private _running = new Map<string, string>();
}
