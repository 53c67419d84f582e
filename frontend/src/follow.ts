/**
 * Without real-time collaboration a page keeps its own copy of an open notebook. When the server says an
 * agent wrote a notebook open here, the page follows the file: with no unsaved edits it reloads it from
 * disk at once (the active cell and the scroll position kept); with unsaved edits of the person's own it
 * shows a banner in the notebook (not a modal) offering the diff, a reload, or keeping the person's version.
 * A collaborative page is the live document already and is left alone.
 */
import { Contents } from '@jupyterlab/services';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { CommandRegistry } from '@lumino/commands';
import { IDisposable } from '@lumino/disposable';
import { Widget } from '@lumino/widgets';

import { IChange } from './api';
import { changedOnDisk } from './format';
import { nullTranslator, TranslationBundle } from '@jupyterlab/translation';
import { DOMAIN } from './i18n';
import { CellMarks } from './marks';

export const BANNER_CLASS = 'jp-agent-banner';

interface IFollowed {
  /** The cells as the page last loaded or saved them: what "unsaved edits" are measured against. */
  saved: string | null;
  checking: Promise<void> | null;
  again: boolean;
  /** The newest agent change of the file the page does not show yet. */
  change: IChange | null;
  banner: Widget | null;
}

export class NotebookFollower implements IDisposable {
  constructor(
    private readonly tracker: INotebookTracker,
    private readonly contents: Contents.IManager,
    private readonly commands: CommandRegistry,
    private readonly marks: CellMarks | null,
    private readonly trans: TranslationBundle = nullTranslator.load(DOMAIN)
  ) {
    tracker.widgetAdded.connect(this._onAdded, this);
    tracker.forEach(panel => this._state(panel));
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    this._disposed = true;
    this.tracker.widgetAdded.disconnect(this._onAdded, this);
    for (const state of this._followed.values()) {
      state.banner?.dispose();
    }
  }

  /** The server says `path` was written (by the ledger's change `change`, when it is one). */
  written(path: string, change: IChange | null): void {
    if (this._disposed) {
      return;
    }
    this.tracker.forEach(panel => {
      if (panel.context.path === path && !panel.context.model.collaborative) {
        const state = this._state(panel);
        if (change) {
          state.change = change;
        }
        void this._check(panel, state);
      }
    });
  }

  /** Checks of one page run one at a time; events during a check ask for one more after it. */
  private async _check(panel: NotebookPanel, state: IFollowed): Promise<void> {
    if (state.checking) {
      state.again = true;
      return;
    }
    do {
      state.again = false;
      state.checking = this._checkNow(panel, state).catch(error =>
        console.warn('jupyter-agent-tools: cannot follow the file', error)
      );
      await state.checking;
      state.checking = null;
    } while (state.again && !panel.isDisposed);
  }

  private async _checkNow(panel: NotebookPanel, state: IFollowed) {
    const context = panel.context;
    await context.ready;
    const seq = this.marks?.book.seq ?? 0;
    const disk = await this.contents.get(context.path, {
      content: false,
      hash: true
    });
    if (panel.isDisposed) {
      return;
    }
    const page = context.contentsModel;
    const same =
      disk.hash && page?.hash
        ? disk.hash === page.hash
        : disk.last_modified === page?.last_modified;
    if (same) {
      this._settled(panel, state, seq); // (the page already has it, or saved over it)
    } else if (!hasUnsavedEdits(panel, state)) {
      await revertKeepingView(panel);
      this._settled(panel, state, seq);
    } else {
      this._banner(panel, state);
    }
  }

  private _settled(panel: NotebookPanel, state: IFollowed, seq: number) {
    state.banner?.dispose();
    state.banner = null;
    state.change = null;
    this.marks?.synced(panel, seq);
  }

  private _banner(panel: NotebookPanel, state: IFollowed): void {
    if (!state.banner || state.banner.isDisposed) {
      state.banner = new Widget();
      state.banner.addClass(BANNER_CLASS);
      state.banner.node.setAttribute('role', 'alert');
      panel.contentHeader.addWidget(state.banner);
    }
    const node = state.banner.node;
    const change = state.change;
    const text = document.createElement('span');
    text.className = `${BANNER_CLASS}-text`;
    text.textContent = changedOnDisk(this.trans, change);
    const actions: [string, string, () => Promise<void>][] = [
      [
        'reload',
        this.trans.__('Reload (drop my unsaved edits)'),
        () => this._reload(panel, state)
      ],
      ['keep', this.trans.__('Keep mine'), () => this._keep(panel, state)]
    ];
    if (change) {
      actions.unshift([
        'diff',
        this.trans.__('Show diff'),
        async () => {
          await this.commands.execute('agents:diff', {
            path: change.path,
            id: change.id
          });
        }
      ]);
    }
    const buttons = actions.map(([action, label, act]) => {
      const button = document.createElement('button');
      button.className = 'jp-Button jp-mod-minimal jp-mod-small';
      button.dataset.action = action;
      button.textContent = label;
      button.addEventListener('click', () => void act());
      return button;
    });
    node.replaceChildren(text, ...buttons);
    // The header's box layout gives a widget its minimum height: the banner's, once its text wrapped.
    const banner = state.banner;
    requestAnimationFrame(() => {
      if (!banner.isDisposed) {
        node.style.minHeight = '';
        node.style.minHeight = `${Math.max(node.scrollHeight, node.offsetHeight)}px`;
        banner.parent?.fit();
      }
    });
  }

  /** Reload: the file's version (the agent's), the person's unsaved edits dropped. */
  private async _reload(panel: NotebookPanel, state: IFollowed) {
    const seq = this.marks?.book.seq ?? 0;
    await revertKeepingView(panel);
    this._settled(panel, state, seq);
  }

  /**
   * Keep mine: the page's version is saved at once, as the person chose, without JupyterLab's "File
   * Changed" dialog; the server records a save over an agent's change, whose undo gives it back.
   */
  private async _keep(panel: NotebookPanel, state: IFollowed) {
    const context = panel.context;
    await this.contents.save(context.path, {
      type: 'notebook',
      format: 'json',
      content: context.model.toJSON()
    });
    context.model.dirty = false;
    // The page adopts the file it just wrote (its hash): a later save asks nothing.
    await revertKeepingView(panel);
    this._settled(panel, state, this.marks?.book.seq ?? 0);
  }

  private _onAdded(_: INotebookTracker, panel: NotebookPanel): void {
    this._state(panel);
  }

  private _state(panel: NotebookPanel): IFollowed {
    let state = this._followed.get(panel);
    if (!state) {
      state = {
        saved: null,
        checking: null,
        again: false,
        change: null,
        banner: null
      };
      this._followed.set(panel, state);
      const followed = state;
      const remember = () => {
        followed.saved = cellsOf(panel);
      };
      panel.context.ready.then(remember).catch(() => undefined);
      // Loaded, saved or reverted: the cells as the file has them. With the banner shown, the person's
      // save or revert may have settled it.
      const onFile = () => {
        remember();
        if (followed.banner) {
          void this._check(panel, followed);
        }
      };
      panel.context.fileChanged.connect(onFile);
      panel.disposed.connect(() => {
        panel.context.fileChanged.disconnect(onFile);
        this._followed.delete(panel);
      });
    }
    return state;
  }

  private _disposed = false;
  private _followed = new Map<NotebookPanel, IFollowed>();
}

/** The page's cells (sources, outputs, ...) as JSON. */
function cellsOf(panel: NotebookPanel): string | null {
  const model = panel.context.model;
  return model
    ? JSON.stringify(model.sharedModel.cells.map(cell => cell.toJSON()))
    : null;
}

/**
 * Whether the page has edits of the person's own not in the file: its cells differ from those it last
 * loaded or saved. (JupyterLab also calls a notebook dirty for what the person did not do, such as the
 * kernel's `language_info` written into its metadata when it starts; a reload loses nothing of that.)
 */
function hasUnsavedEdits(panel: NotebookPanel, state: IFollowed): boolean {
  return (
    panel.context.model.dirty &&
    (state.saved === null || cellsOf(panel) !== state.saved)
  );
}

/** Load the notebook from disk again, keeping the active cell (by id) and the scroll position. */
export async function revertKeepingView(panel: NotebookPanel): Promise<void> {
  const notebook = panel.content;
  const activeId = notebook.activeCell?.model.id;
  const activeIndex = notebook.activeCellIndex;
  const scroller = notebook.outerNode;
  const top = scroller.scrollTop;
  await panel.context.revert();
  const found = notebook.widgets.findIndex(c => c.model.id === activeId);
  notebook.activeCellIndex =
    found >= 0 ? found : Math.min(activeIndex, notebook.widgets.length - 1);
  scroller.scrollTop = top;
}
