/**
 * The extension's commands (in the command palette, under "Agents"): open the panel, interrupt or stop
 * an agent's session, show a change's diff, undo it, open the notebook at the cell it changed. The
 * panel's and the banner's buttons run them. Without arguments, interrupt and stop act on the newest busy
 * session, diff and undo on the newest change (of the current notebook, when one is current).
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, ICommandPalette, showDialog } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';
import { Widget } from '@lumino/widgets';

import { IChange, IChangeDetail, ISession } from './api';
import { diffLines, when } from './format';
import { trans } from './i18n';
import { AgentModel } from './model';
import { el } from './panel';

export const CommandIds = {
  openPanel: 'agents:open-panel',
  interrupt: 'agents:interrupt',
  stop: 'agents:stop',
  diff: 'agents:diff',
  undo: 'agents:undo',
  openChange: 'agents:open-change'
};

export function addCommands(
  app: JupyterFrontEnd,
  model: AgentModel,
  panelId: string,
  tracker: INotebookTracker | null,
  palette: ICommandPalette | null
): void {
  const { commands } = app;
  const session = (args: ReadonlyPartialJSONObject): ISession | undefined =>
    typeof args.session === 'string'
      ? model.session(args.session)
      : model.sessions.find(s => s.busy);
  const change = (args: ReadonlyPartialJSONObject): IChange | undefined => {
    if (typeof args.id === 'string') {
      return (
        model.change(args.id) ??
        // (a change no longer listed, e.g. from a notebook's banner)
        (typeof args.path === 'string'
          ? ({ id: args.id, path: args.path } as IChange)
          : undefined)
      );
    }
    const current = tracker?.currentWidget?.context.path;
    return model.changes.find(
      c => (!current || c.path === current) && (!args.undoable || c.undoable)
    );
  };

  commands.addCommand(CommandIds.openPanel, {
    describedBy: { args: { type: 'object', properties: {} } },
    label: trans.__('Open the Agents Panel'),
    execute: () => app.shell.activateById(panelId)
  });
  commands.addCommand(CommandIds.interrupt, {
    describedBy: {
      args: {
        type: 'object',
        properties: {
          session: {
            type: 'string',
            description: trans.__('The session (default: the newest busy one)')
          }
        }
      }
    },
    label: args => {
      const s = session(args);
      return s
        ? trans.__('Interrupt Agent Session %1', s.name)
        : trans.__('Interrupt Agent Session');
    },
    isEnabled: args => session(args) !== undefined,
    execute: async args => {
      const s = session(args);
      if (s) {
        await model.act(() => model.interrupt(s));
      }
    }
  });
  commands.addCommand(CommandIds.stop, {
    describedBy: {
      args: {
        type: 'object',
        properties: {
          session: {
            type: 'string',
            description: trans.__('The session (default: the newest busy one)')
          }
        }
      }
    },
    label: args => {
      const s = session(args);
      return s
        ? trans.__('Stop Agent Session %1', s.name)
        : trans.__('Stop Agent Session');
    },
    isEnabled: args => session(args) !== undefined,
    execute: async args => {
      const s = session(args);
      if (!s) {
        return;
      }
      const answer = await showDialog({
        title: trans.__('Stop session %1?', s.name),
        body: trans.__(
          'Its kernel is shut down: its variables are lost, a running call is cancelled.'
        ),
        buttons: [
          Dialog.cancelButton(),
          Dialog.warnButton({ label: trans.__('Stop') })
        ]
      });
      if (answer.button.accept) {
        await model.act(() => model.stop(s));
      }
    }
  });
  commands.addCommand(CommandIds.diff, {
    describedBy: {
      args: {
        type: 'object',
        properties: {
          path: { type: 'string', description: trans.__('The notebook') },
          id: {
            type: 'string',
            description: trans.__(
              'The change (default: the newest of the current notebook)'
            )
          }
        }
      }
    },
    label: args => {
      const c = change(args);
      return c
        ? trans.__("Show Agent Change %1's Diff", c.id)
        : trans.__('Show Agent Change Diff');
    },
    isEnabled: args => change(args) !== undefined,
    execute: async args => {
      const c = change(args);
      if (!c) {
        return;
      }
      let detail: IChangeDetail | null = null;
      await model.act(async () => {
        detail = await model.detail(c);
        return '';
      }, c.id);
      if (detail) {
        await showDialog({
          title: trans.__(
            'Change %1 of %2: %3',
            c.id,
            c.path,
            (detail as IChangeDetail).action
          ),
          body: new Widget({ node: diffNode(detail) }),
          buttons: [Dialog.okButton({ label: trans.__('Close') })]
        });
      }
    }
  });
  commands.addCommand(CommandIds.undo, {
    describedBy: {
      args: {
        type: 'object',
        properties: {
          path: { type: 'string', description: trans.__('The notebook') },
          id: {
            type: 'string',
            description: trans.__(
              'The change (default: the newest of the current notebook)'
            )
          }
        }
      }
    },
    label: args => {
      const c = change({ undoable: true, ...args });
      return c
        ? trans.__('Undo Agent Change %1 (%2)', c.id, c.action ?? '')
        : trans.__('Undo Agent Change');
    },
    isEnabled: args => change({ undoable: true, ...args }) !== undefined,
    execute: async args => {
      const c = change({ undoable: true, ...args });
      if (c) {
        await model.act(() => model.undo(c), c.id);
      }
    }
  });
  commands.addCommand(CommandIds.openChange, {
    describedBy: {
      args: {
        type: 'object',
        properties: {
          path: { type: 'string', description: trans.__('The notebook') },
          id: {
            type: 'string',
            description: trans.__(
              'The change (default: the newest of the current notebook)'
            )
          }
        }
      }
    },
    label: trans.__('Open the Notebook at the Changed Cell'),
    execute: async args => {
      const c = change(args);
      if (!c) {
        return;
      }
      const cellId = c.cells?.find(
        cell => cell.id && !cell.what.includes('deleted')
      )?.id;
      const widget = await commands.execute('docmanager:open', {
        path: c.path
      });
      if (cellId && widget instanceof NotebookPanel) {
        await widget.context.ready;
        const index = widget.content.widgets.findIndex(
          cell => cell.model.id === cellId
        );
        if (index >= 0) {
          widget.content.activeCellIndex = index;
          await widget.content.scrollToItem(index);
        }
      }
    }
  });
  if (palette) {
    const category = trans.__('Agents');
    for (const command of [
      CommandIds.openPanel,
      CommandIds.interrupt,
      CommandIds.stop,
      CommandIds.diff,
      CommandIds.undo
    ]) {
      palette.addItem({ command, category });
    }
  }
}

/** A change's detail: each cell's unified diff, or its other parts before and after. */
function diffNode(detail: IChangeDetail): HTMLElement {
  const root = el('div', 'jp-AgentActivity-diff');
  root.append(
    el(
      'div',
      'jp-AgentActivity-diffHeader',
      trans.__(
        '%1 via %2, %3',
        detail.user ?? trans.__('unknown'),
        detail.via ?? '?',
        when(detail.time)
      )
    )
  );
  for (const cell of detail.cells) {
    root.append(
      el(
        'h4',
        '',
        trans.__('cell %1: %2', cell.id ?? '?', cell.what.join(', '))
      )
    );
    const pre = el('pre', 'jp-AgentActivity-diffText');
    const diff =
      cell.diff ??
      [
        cell.before
          ? trans.__('before: %1', JSON.stringify(cell.before, null, 1))
          : '',
        cell.after
          ? trans.__('after: %1', JSON.stringify(cell.after, null, 1))
          : ''
      ]
        .filter(Boolean)
        .join('\n');
    for (const [line, kind] of diffLines(diff)) {
      pre.append(el('span', kind ? `jp-mod-${kind}` : '', `${line}\n`));
    }
    root.append(pre);
  }
  return root;
}
