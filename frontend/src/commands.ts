/**
 * The extension's commands (in the command palette, under "Agents"): open the panel, approve or deny an
 * agent's request, interrupt or stop an agent's session, show a change's diff, undo it, open the notebook
 * at the cell it changed. The panel's and the banner's buttons run them. Without arguments, approve and
 * deny act on the oldest waiting request (after showing it), interrupt and stop on the newest busy
 * session, diff and undo on the newest change (of the current notebook, when one is current). "Connect an
 * agent" makes an agent token (connect.ts); revoking one asks first.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  InputDialog,
  showDialog
} from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import {
  ReadonlyJSONObject,
  ReadonlyPartialJSONObject
} from '@lumino/coreutils';
import { Widget } from '@lumino/widgets';

import { IApproval, IChange, IChangeDetail, ISession } from './api';
import { approvalInUrl } from './approvals';
import { connectAgent } from './connect';
import { parseAgents } from './focus';
import { cellDiffText, when } from './format';
import { trans } from './i18n';
import { AgentModel } from './model';
import { AgentPanel, approvalNode, diffText, el } from './panel';
import type { FocusSharer } from './share';

export const CommandIds = {
  openPanel: 'agents:open-panel',
  interrupt: 'agents:interrupt',
  stop: 'agents:stop',
  diff: 'agents:diff',
  undo: 'agents:undo',
  openChange: 'agents:open-change',
  openApproval: 'agents:open-approval',
  approve: 'agents:approve',
  deny: 'agents:deny',
  connectAgent: 'agents:connect-agent',
  revokeToken: 'agents:revoke-token',
  shareFocus: 'agents:share-focus'
};

/** A command's `describedBy`: its arguments, each a JSON schema. */
function described(properties: { [name: string]: ReadonlyJSONObject }): {
  args: ReadonlyJSONObject;
} {
  return { args: { type: 'object', properties } };
}

export function addCommands(
  app: JupyterFrontEnd,
  model: AgentModel,
  panel: AgentPanel,
  tracker: INotebookTracker | null,
  palette: ICommandPalette | null,
  focus: FocusSharer | null = null
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

  const approval = (args: ReadonlyPartialJSONObject): IApproval | undefined =>
    typeof args.id === 'number' ? model.approval(args.id) : model.approvals[0];
  /** A request asked about from the palette (no id): shown in full first; true when confirmed. */
  const confirmed = async (
    a: IApproval,
    args: ReadonlyPartialJSONObject,
    label: string
  ): Promise<boolean> => {
    if (typeof args.id === 'number') {
      return true;
    }
    const answer = await showDialog({
      title: trans.__('%1 (request %2)', a.summary, a.id),
      body: new Widget({ node: approvalNode(a) }),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label })]
    });
    return answer.button.accept;
  };

  commands.addCommand(CommandIds.openPanel, {
    describedBy: described({}),
    label: trans.__('Open the Agents Panel'),
    execute: () => app.shell.activateById(panel.id)
  });
  commands.addCommand(CommandIds.openApproval, {
    describedBy: described({
      id: { type: 'number', description: trans.__('The request') },
      search: {
        type: 'string',
        description: trans.__(
          "A URL's query naming it (?agent-approval=12), as the router gives it"
        )
      }
    }),
    label: trans.__('Show a Request in the Agents Panel'),
    execute: async args => {
      const id =
        typeof args.id === 'number'
          ? args.id
          : approvalInUrl(String(args.search ?? ''));
      await app.restored; // (routed at load: the restored layout would hide the panel again)
      app.shell.activateById(panel.id);
      if (id !== null) {
        panel.reveal(id);
      }
    }
  });
  commands.addCommand(CommandIds.approve, {
    describedBy: described({
      id: {
        type: 'number',
        description: trans.__(
          'The request (default: the oldest waiting one, shown first)'
        )
      },
      for_seconds: {
        type: 'number',
        description: trans.__(
          "Also approve this agent's same action on the same notebook for that long"
        )
      }
    }),
    label: args => {
      const a = approval(args);
      return a
        ? trans.__('Approve Agent Request %1: %2', a.id, a.summary)
        : trans.__('Approve Agent Request');
    },
    isEnabled: args => approval(args) !== undefined,
    execute: async args => {
      const a = approval(args);
      if (!a || !(await confirmed(a, args, trans.__('Approve')))) {
        return;
      }
      const forSeconds =
        typeof args.for_seconds === 'number' ? args.for_seconds : undefined;
      await model.act(() =>
        model.decide(a, {
          decision: 'approve',
          ...(forSeconds ? { for_seconds: forSeconds } : {})
        })
      );
    }
  });
  commands.addCommand(CommandIds.deny, {
    describedBy: described({
      id: {
        type: 'number',
        description: trans.__(
          'The request (default: the oldest waiting one, shown first)'
        )
      },
      reason: {
        type: 'string',
        description: trans.__(
          'Why (the agent is told); without it, it is asked for'
        )
      }
    }),
    label: args => {
      const a = approval(args);
      return a
        ? trans.__('Deny Agent Request %1: %2', a.id, a.summary)
        : trans.__('Deny Agent Request');
    },
    isEnabled: args => approval(args) !== undefined,
    execute: async args => {
      const a = approval(args);
      if (!a || !(await confirmed(a, args, trans.__('Deny…')))) {
        return;
      }
      let reason = typeof args.reason === 'string' ? args.reason : null;
      if (reason === null) {
        const answer = await InputDialog.getText({
          title: trans.__('Deny request %1', a.id),
          label: trans.__('Reason (optional, the agent is told)'),
          okLabel: trans.__('Deny')
        });
        if (!answer.button.accept) {
          return;
        }
        reason = answer.value ?? '';
      }
      await model.act(() =>
        model.decide(a, {
          decision: 'deny',
          ...(reason ? { reason } : {})
        })
      );
    }
  });
  commands.addCommand(CommandIds.interrupt, {
    describedBy: described({
      session: {
        type: 'string',
        description: trans.__('The session (default: the newest busy one)')
      }
    }),
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
    describedBy: described({
      session: {
        type: 'string',
        description: trans.__('The session (default: the newest busy one)')
      }
    }),
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
    describedBy: described({
      path: { type: 'string', description: trans.__('The notebook') },
      id: {
        type: 'string',
        description: trans.__(
          'The change (default: the newest of the current notebook)'
        )
      }
    }),
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
    describedBy: described({
      path: { type: 'string', description: trans.__('The notebook') },
      id: {
        type: 'string',
        description: trans.__(
          'The change (default: the newest of the current notebook)'
        )
      }
    }),
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
    describedBy: described({
      path: { type: 'string', description: trans.__('The notebook') },
      id: {
        type: 'string',
        description: trans.__(
          'The change (default: the newest of the current notebook)'
        )
      }
    }),
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
  commands.addCommand(CommandIds.connectAgent, {
    describedBy: described({}),
    label: trans.__('Connect an Agent…'),
    caption: trans.__(
      'Make an agent token (scopes, paths, what it asks you first) and copy how to connect an agent with it'
    ),
    execute: async () => {
      const created = await connectAgent(
        model,
        app.serviceManager.serverSettings.baseUrl
      );
      if (created) {
        app.shell.activateById(panel.id);
      }
    }
  });
  commands.addCommand(CommandIds.revokeToken, {
    describedBy: described({
      name: { type: 'string', description: trans.__('The agent token') }
    }),
    label: args =>
      typeof args.name === 'string'
        ? trans.__('Revoke Agent Token %1', args.name)
        : trans.__('Revoke Agent Token'),
    isEnabled: args =>
      typeof args.name === 'string' &&
      model.tokens.some(t => t.name === args.name && t.status === 'active'),
    execute: async args => {
      const name = String(args.name);
      const answer = await showDialog({
        title: trans.__("Revoke the agent token '%1'?", name),
        body: trans.__(
          'The agent using it is refused from now on: its open connections close, its requests waiting for you are withdrawn and its detached runs cancelled.'
        ),
        buttons: [
          Dialog.cancelButton(),
          Dialog.warnButton({ label: trans.__('Revoke') })
        ]
      });
      if (answer.button.accept) {
        await model.act(() => model.revokeToken(name));
      }
    }
  });
  commands.addCommand(CommandIds.shareFocus, {
    describedBy: described({
      on: {
        type: 'boolean',
        description: trans.__('On or off (default: the other way round)')
      },
      agents: {
        type: 'string',
        description: trans.__(
          'Agent token names, separated by commas (default: every agent)'
        )
      }
    }),
    label: trans.__('Share My Focus with Agents'),
    caption: trans.__(
      'Let agents read the notebook, cell and selection you look at in this tab; off again stops it at once'
    ),
    isEnabled: () => focus !== null,
    isToggled: () => focus?.sharing ?? false,
    execute: async args => {
      if (!focus) {
        return;
      }
      const on = typeof args.on === 'boolean' ? args.on : !focus.sharing;
      if (!on) {
        await focus.stop();
        return;
      }
      await focus.share(
        typeof args.agents === 'string' ? parseAgents(args.agents) : 'all'
      );
    }
  });
  focus?.changed.connect(() =>
    commands.notifyCommandChanged(CommandIds.shareFocus)
  );
  if (palette) {
    const category = trans.__('Agents');
    for (const command of [
      CommandIds.openPanel,
      CommandIds.shareFocus,
      CommandIds.connectAgent,
      CommandIds.approve,
      CommandIds.deny,
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
    root.append(diffText(cellDiffText(cell)));
  }
  return root;
}
