/**
 * "Share my focus" in the page (focus.ts says what is shared and when): the tab publishes what it shows
 * while the person shares it, and does the agents' allow-listed UI actions addressed to it.
 */
import { Notification } from '@jupyterlab/apputils';
import { CodeCellModel } from '@jupyterlab/cells';
import { URLExt } from '@jupyterlab/coreutils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';
import { CommandRegistry } from '@lumino/commands';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { IAgentEvent } from './api';
import { AgentEvents } from './events';
import {
  DEBOUNCE_MS,
  describeAction,
  eventFor,
  fitBody,
  HEARTBEAT_MS,
  IFocusBody,
  IUiAction,
  makeTabId,
  selectionText
} from './focus';
import { trans } from './i18n';

/** This page's shared focus: publishes while on, does the agents' UI actions addressed to it. */
export class FocusSharer implements IDisposable {
  constructor(
    private readonly settings: ServerConnection.ISettings,
    events: AgentEvents,
    private readonly tracker: INotebookTracker,
    private readonly commands: CommandRegistry,
    readonly tab = makeTabId()
  ) {
    events.event.connect(this._onEvent, this);
    tracker.currentChanged.connect(this._watch, this);
    window.addEventListener('pagehide', this._onPageHide);
  }

  /** Sharing on or off, who it is shared with, a read or a problem. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get sharing(): boolean {
    return this._sharing;
  }

  get agents(): 'all' | string[] {
    return this._agents;
  }

  /** The last agent that read this tab's focus, and when (ISO), or null. */
  get lastRead(): { agent: string; at: string } | null {
    return this._lastRead;
  }

  /** Why the last publication failed (the server's message), or ''. */
  get problem(): string {
    return this._problem;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    void this.stop();
    this._disposed = true;
    window.removeEventListener('pagehide', this._onPageHide);
    this._unwatch();
    Signal.clearData(this);
  }

  /** Share with `agents` (on, or who changed): published at once. */
  async share(agents: 'all' | string[] = this._agents): Promise<void> {
    this._sharing = true;
    this._agents = agents;
    this._watch();
    clearInterval(this._heartbeat);
    this._heartbeat = setInterval(() => void this.publish(), HEARTBEAT_MS);
    this._changed.emit();
    await this.publish();
  }

  /** Stop sharing: the server forgets this tab's focus at once. */
  async stop(keepalive = false): Promise<void> {
    const was = this._sharing;
    this._sharing = false;
    clearInterval(this._heartbeat);
    clearTimeout(this._debounce);
    this._lastRead = null;
    this._problem = '';
    this._changed.emit();
    if (was) {
      await this._request('DELETE', undefined, keepalive).catch(
        () => undefined
      );
    }
  }

  /** Publish what this tab shows now (while sharing). */
  async publish(): Promise<void> {
    if (!this._sharing) {
      return;
    }
    try {
      await this._request('PUT', JSON.stringify(fitBody(this.body())));
      this._setProblem('');
    } catch (error) {
      this._setProblem(String((error as Error).message ?? error));
    }
  }

  /** What this tab shows, as published. */
  body(): IFocusBody {
    const panel = this.tracker.currentWidget;
    const body: IFocusBody = {
      agents: this._agents,
      path: panel?.context.path ?? null,
      cell: null,
      selection: null,
      kernel: null
    };
    if (!panel) {
      return body;
    }
    const session = panel.sessionContext;
    body.kernel = {
      name: session.session?.kernel?.name ?? null,
      status: session.kernelDisplayStatus ?? null
    };
    const cell = panel.content.activeCell;
    if (!cell) {
      return body;
    }
    const model = cell.model;
    const source = model.sharedModel.getSource();
    const code = model instanceof CodeCellModel ? model : null;
    body.cell = {
      id: model.id ?? null,
      index: panel.content.activeCellIndex,
      cell_type: model.type,
      source,
      execution_count: code ? code.executionCount : null,
      outputs: code ? (code.outputs.toJSON() as any[]) : []
    };
    const selection = cell.editor?.getSelection();
    if (selection) {
      const text = selectionText(source, selection.start, selection.end);
      if (text) {
        body.selection = { text, start: selection.start, end: selection.end };
      }
    }
    return body;
  }

  /** Do an agent's UI action (only the allow-listed ones). */
  async perform(action: IUiAction): Promise<void> {
    switch (action.action) {
      case 'open_notebook':
        await this.commands.execute('docmanager:open', { path: action.path! });
        break;
      case 'reveal_cell':
        await this._reveal(action);
        break;
      case 'show_change':
        await this.commands.execute('agents:diff', {
          path: action.path!,
          id: action.change_id!
        });
        break;
      case 'open_approval':
        await this.commands.execute('agents:open-approval', {
          id: action.approval_id!
        });
        break;
    }
  }

  private async _reveal(action: IUiAction): Promise<void> {
    const widget = await this.commands.execute('docmanager:open', {
      path: action.path!
    });
    if (!(widget instanceof NotebookPanel)) {
      return;
    }
    await widget.context.ready;
    const cells = widget.content.widgets;
    let index =
      action.cell_id !== undefined
        ? cells.findIndex(c => c.model.id === action.cell_id)
        : (action.cell_index ?? -1);
    if (index < 0 || index >= cells.length) {
      index = -1;
    }
    if (index < 0) {
      Notification.warning(
        trans.__('%1: that cell is not in %2', action.user, action.path ?? '')
      );
      return;
    }
    widget.content.activeCellIndex = index;
    await widget.content.scrollToItem(index);
    const node = cells[index].node;
    node.classList.add('jp-AgentFocus-revealed');
    node.dataset.agentRevealed = action.user;
    setTimeout(() => {
      node.classList.remove('jp-AgentFocus-revealed');
      delete node.dataset.agentRevealed;
    }, 8000);
  }

  private _onEvent(_: AgentEvents, event: IAgentEvent): void {
    const found = eventFor(event, this.tab);
    if (!found) {
      return;
    }
    if (found.kind === 'read') {
      this._lastRead = { agent: found.agent, at: new Date().toISOString() };
      this._changed.emit();
      return;
    }
    const { action } = found;
    const line = action.message
      ? `${describeAction(action)}: ${action.message}`
      : describeAction(action);
    if (found.kind === 'do') {
      void this.perform(action).catch(error => console.error(error));
      Notification.info(line, { autoClose: 6000 });
      return;
    }
    Notification.info(line, {
      autoClose: false,
      actions: [
        {
          label: trans.__('Show'),
          caption: trans.__('Do what the agent asks to show you'),
          callback: () => void this.perform(action)
        }
      ]
    });
  }

  /** Follow the current notebook: its active cell, contents, selection and kernel state. */
  private _watch(): void {
    this._unwatch();
    const panel = this.tracker.currentWidget;
    if (!panel) {
      this._soon();
      return;
    }
    const notebook = panel.content;
    // (a cell's source or outputs; the kernel's busy then idle after a run, whose outputs are then kept)
    const watched: [ISignal<any, any>, () => void][] = [
      [notebook.activeCellChanged, this._onActiveCell],
      [notebook.modelContentChanged, this._soon],
      [panel.sessionContext.statusChanged, this._soon],
      [panel.context.pathChanged, this._soon]
    ];
    for (const [signal, slot] of watched) {
      signal.connect(slot, this);
    }
    this._watched = watched;
    this._onActiveCell();
  }

  private _unwatch(): void {
    for (const [signal, slot] of this._watched) {
      signal.disconnect(slot, this);
    }
    this._watched = [];
    this._unwatchCell();
  }

  private _onActiveCell(): void {
    this._unwatchCell();
    const cell = this.tracker.currentWidget?.content.activeCell;
    if (cell) {
      const selections = cell.model.selections;
      const onSelection = () => this._soon();
      selections.changed.connect(onSelection);
      this._cellWatch = () => selections.changed.disconnect(onSelection);
    }
    this._soon();
  }

  private _unwatchCell(): void {
    this._cellWatch?.();
    this._cellWatch = null;
  }

  private _soon(): void {
    if (!this._sharing) {
      return;
    }
    clearTimeout(this._debounce);
    this._debounce = setTimeout(() => void this.publish(), DEBOUNCE_MS);
  }

  private _setProblem(problem: string): void {
    if (problem !== this._problem) {
      this._problem = problem;
      this._changed.emit();
    }
  }

  private async _request(
    method: 'PUT' | 'DELETE',
    body?: string,
    keepalive = false
  ): Promise<void> {
    const url = URLExt.join(
      this.settings.baseUrl,
      'api/agent/focus/tabs',
      this.tab
    );
    const response = await ServerConnection.makeRequest(
      url,
      { method, body, keepalive },
      this.settings
    );
    if (!response.ok) {
      let message = `${response.status} ${response.statusText}`;
      try {
        message = (await response.json()).message ?? message;
      } catch {
        // (not JSON: the status says it)
      }
      throw new Error(message);
    }
  }

  private _onPageHide = (): void => {
    void this.stop(true);
  };

  private _disposed = false;
  private _sharing = false;
  private _agents: 'all' | string[] = 'all';
  private _lastRead: { agent: string; at: string } | null = null;
  private _problem = '';
  private _heartbeat: ReturnType<typeof setInterval> | undefined;
  private _debounce: ReturnType<typeof setTimeout> | undefined;
  private _watched: [ISignal<any, any>, () => void][] = [];
  private _cellWatch: (() => void) | null = null;
  private _changed = new Signal<this, void>(this);
}
