/**
 * jupyter-agent-tools' frontend, as JupyterLab plugins sharing the model through the `IAgentModel` token
 * (agentModel.ts): the model of what the server's routes and events say (`jupyter-agent-tools:plugin`,
 * whose settings it reads); the "Agents" panel in the left sidebar of JupyterLab and Notebook 7; the
 * marks on cells agents changed or wait to change; an open notebook that follows the file without
 * real-time collaboration; a notification for each request waiting for the person's decision; the
 * commands; "Share my focus". Disabling `jupyter-agent-tools:plugin` disables them all.
 */
import {
  ILayoutRestorer,
  IRouter,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { ITranslator } from '@jupyterlab/translation';
import { LabIcon } from '@jupyterlab/ui-components';

import { IAgentCellMarks, IAgentFocus, IAgentModel } from './agentModel';
import { Api } from './api';
// The panel is in the sidebar from the start: activation needs these modules at once.
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { APPROVAL_URL_PATTERN, asked } from './approvals';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import {
  addCommands,
  addFocusCommand,
  addPanelCommands,
  CommandIds
} from './commands';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { AgentEvents } from './events';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { NotebookFollower } from './follow';
import { translation } from './i18n';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { CellMarks } from './marks';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { AgentModel } from './model';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { AgentPanel } from './panel';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { FocusSharer } from './share';

/** The model's plugin: its id names the settings (schema/plugin.json). */
const PLUGIN_ID = 'jupyter-agent-tools:plugin';

const ICON = new LabIcon({
  name: 'jupyter-agent-tools:agents',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<path d="M12 2a2 2 0 0 1 1 3.7V7h5a3 3 0 0 1 3 3v8a3 3 0 0 1-3 3H6a3 3 0 0 1-3-3v-8a3 3 0 0 1 3-3h5V5.7A2 2 0 0 1 12 2zM8.5 11a1.5 1.5 0 1 0 0 3 1.5 1.5 0 0 0 0-3zm7 0a1.5 1.5 0 1 0 0 3 1.5 1.5 0 0 0 0-3zM8 16.5v1.5h8v-1.5z"/>' +
    '</g></svg>'
});

/** Apply the settings to `apply` now and each time they change. */
function withSettings(
  registry: ISettingRegistry | null,
  apply: (settings: ISettingRegistry.ISettings) => void
): void {
  registry
    ?.load(PLUGIN_ID)
    .then(loaded => {
      apply(loaded);
      loaded.changed.connect(apply);
    })
    .catch(reason =>
      console.error('jupyter-agent-tools: settings not loaded', reason)
    );
}

/** The model: sessions, changes, requests and tokens, from the server's routes and its event bus. */
const modelPlugin: JupyterFrontEndPlugin<IAgentModel> = {
  id: PLUGIN_ID,
  description:
    'What AI agents do in this server, from its routes and events (the model the other plugins show).',
  autoStart: true,
  provides: IAgentModel,
  optional: [ISettingRegistry, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    settings: ISettingRegistry | null,
    translator: ITranslator | null
  ): IAgentModel => {
    const serverSettings = app.serviceManager.serverSettings;
    const model = new AgentModel(
      new Api(serverSettings),
      new AgentEvents(serverSettings),
      translation(translator)
    );
    withSettings(settings, loaded => {
      model.maxChanges = loaded.get('maxChanges').composite as number;
    });
    return model;
  }
};

/** "Share my focus" (off until the person turns it on): this tab's notebook and cell, for agents. */
const focusPlugin: JupyterFrontEndPlugin<FocusSharer> = {
  id: 'jupyter-agent-tools:focus',
  description:
    'Share my focus: agents may read the notebook and cell this tab shows, while the person allows it.',
  autoStart: true,
  provides: IAgentFocus,
  requires: [IAgentModel, INotebookTracker],
  optional: [ICommandPalette, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    model: IAgentModel,
    tracker: INotebookTracker,
    palette: ICommandPalette | null,
    translator: ITranslator | null
  ): FocusSharer => {
    const trans = translation(translator);
    const focus = new FocusSharer(
      app.serviceManager.serverSettings,
      model,
      tracker,
      app.commands,
      trans
    );
    addFocusCommand(trans, app, focus, palette);
    return focus;
  }
};

/** The "Agents" sidebar panel, its commands, and the URL that shows a request in it. */
const panelPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-agent-tools:panel',
  description:
    'The Agents panel: what AI agents do in this server, with Interrupt, Stop, Diff and Undo.',
  autoStart: true,
  requires: [IAgentModel],
  optional: [
    IAgentFocus,
    ILayoutRestorer,
    ICommandPalette,
    IRouter,
    ITranslator
  ],
  activate: (
    app: JupyterFrontEnd,
    model: IAgentModel,
    focus: FocusSharer | null,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    router: IRouter | null,
    translator: ITranslator | null
  ): void => {
    const trans = translation(translator);
    const panel = new AgentPanel(model, app.commands, focus, trans);
    panel.title.icon = ICON;
    addPanelCommands(trans, app, panel, palette);
    app.shell.add(panel, 'left', { rank: 600 });
    // A URL naming a request (?agent-approval=12, what an MCP client opens) shows it in the panel.
    router?.register({
      command: CommandIds.openApproval,
      pattern: APPROVAL_URL_PATTERN
    });
    restorer?.add(panel, panel.id);
  }
};

/** Marks on the cells agents changed, run, or wait to change (the `marks` setting). */
const marksPlugin: JupyterFrontEndPlugin<CellMarks> = {
  id: 'jupyter-agent-tools:marks',
  description:
    'Marks on the notebook cells agents changed, run, or wait to change.',
  autoStart: true,
  provides: IAgentCellMarks,
  requires: [IAgentModel, INotebookTracker],
  optional: [ISettingRegistry, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    model: IAgentModel,
    tracker: INotebookTracker,
    settings: ISettingRegistry | null,
    translator: ITranslator | null
  ): CellMarks => {
    const marks = new CellMarks(tracker, translation(translator));
    marks.follow(model);
    withSettings(settings, loaded => {
      marks.enabled = loaded.get('marks').composite as boolean;
    });
    return marks;
  }
};

/** Without real-time collaboration, an open notebook follows the file agents write. */
const followerPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-agent-tools:follower',
  description:
    'An open notebook follows the file when an agent writes it (without real-time collaboration).',
  autoStart: true,
  requires: [IAgentModel, INotebookTracker],
  optional: [IAgentCellMarks, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    model: IAgentModel,
    tracker: INotebookTracker,
    marks: CellMarks | null,
    translator: ITranslator | null
  ): void => {
    const follower = new NotebookFollower(
      tracker,
      app.serviceManager.contents,
      app.commands,
      marks,
      translation(translator)
    );
    model.written.connect((_, { path, change }) =>
      follower.written(path, change)
    );
  }
};

/** The requests waiting for the person: a notification each (the marks plugin marks their cells). */
const approvalsPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-agent-tools:approvals',
  description:
    "A notification for each agent's request waiting for your decision.",
  autoStart: true,
  requires: [IAgentModel],
  optional: [ITranslator],
  activate: (
    app: JupyterFrontEnd,
    model: IAgentModel,
    translator: ITranslator | null
  ): void => {
    const trans = translation(translator);
    // A notification for each new request (Review opens the panel); it goes when the request is decided.
    const notices = new Map<number, string>();
    model.asked.connect((_, approval) => {
      notices.set(
        approval.id,
        Notification.info(asked(trans, approval), {
          autoClose: false,
          actions: [
            {
              label: trans.__('Review'),
              caption: trans.__('Show the request in the Agents panel'),
              callback: () =>
                void app.commands.execute(CommandIds.openApproval, {
                  id: approval.id
                })
            }
          ]
        })
      );
    });
    model.settled.connect((_, id) => {
      const notice = notices.get(id);
      if (notice !== undefined) {
        notices.delete(id);
        Notification.dismiss(notice);
      }
    });
  }
};

/** The commands on agents' sessions, changes, requests and tokens (in the palette under "Agents"). */
const commandsPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-agent-tools:commands',
  description:
    "Commands on agents' sessions, changes, requests and tokens: approve, deny, interrupt, stop, diff, undo.",
  autoStart: true,
  requires: [IAgentModel],
  optional: [INotebookTracker, ICommandPalette, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    model: IAgentModel,
    tracker: INotebookTracker | null,
    palette: ICommandPalette | null,
    translator: ITranslator | null
  ): void => {
    addCommands(translation(translator), app, model, tracker, palette);
  }
};

export default [
  modelPlugin,
  focusPlugin,
  panelPlugin,
  marksPlugin,
  followerPlugin,
  approvalsPlugin,
  commandsPlugin
];
