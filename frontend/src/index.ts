/**
 * jupyter-agent-tools' frontend: the "Agents" panel in the left sidebar of JupyterLab and Notebook 7,
 * the requests waiting for the person's decision (in the panel, a count on its tab, a notification each),
 * the marks on cells agents changed or wait to change, an open notebook that follows the file without
 * real-time collaboration, and the commands. It shows what the server's routes and events say.
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

import { Api } from './api';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { APPROVAL_URL_PATTERN, asked, pendingCells } from './approvals';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { addCommands, CommandIds } from './commands';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { AgentEvents } from './events';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { FocusSharer } from './share';
// The panel is in the sidebar from the start: activation needs these modules at once.
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { NotebookFollower } from './follow';
import { setTranslator, trans } from './i18n';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { CellMarks } from './marks';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { AgentModel } from './model';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { AgentPanel } from './panel';

const PLUGIN_ID = 'jupyter-agent-tools:plugin';

const ICON = new LabIcon({
  name: 'jupyter-agent-tools:agents',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<path d="M12 2a2 2 0 0 1 1 3.7V7h5a3 3 0 0 1 3 3v8a3 3 0 0 1-3 3H6a3 3 0 0 1-3-3v-8a3 3 0 0 1 3-3h5V5.7A2 2 0 0 1 12 2zM8.5 11a1.5 1.5 0 1 0 0 3 1.5 1.5 0 0 0 0-3zm7 0a1.5 1.5 0 1 0 0 3 1.5 1.5 0 0 0 0-3zM8 16.5v1.5h8v-1.5z"/>' +
    '</g></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'The Agents panel: what AI agents do in this server, with Interrupt, Stop, Diff and Undo.',
  autoStart: true,
  optional: [
    INotebookTracker,
    ISettingRegistry,
    ILayoutRestorer,
    ITranslator,
    ICommandPalette,
    IRouter
  ],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker | null,
    settings: ISettingRegistry | null,
    restorer: ILayoutRestorer | null,
    translator: ITranslator | null,
    palette: ICommandPalette | null,
    router: IRouter | null
  ) => {
    if (translator) {
      setTranslator(translator);
    }
    const serverSettings = app.serviceManager.serverSettings;
    const events = new AgentEvents(serverSettings);
    const model = new AgentModel(new Api(serverSettings), events);
    // "Share my focus" (off until the person turns it on): this tab's notebook and cell, for agents
    const focus = tracker
      ? new FocusSharer(serverSettings, events, tracker, app.commands)
      : null;
    const marks = tracker ? new CellMarks(tracker) : null;
    const follower = tracker
      ? new NotebookFollower(
          tracker,
          app.serviceManager.contents,
          app.commands,
          marks
        )
      : null;
    if (marks) {
      marks.follow(model);
    }
    model.written.connect((_, { path, change }) =>
      follower?.written(path, change)
    );
    model.running.connect((_, { path, cellId }) =>
      marks?.running(path, cellId)
    );
    if (marks) {
      let marked = model.approvals; // (a new list each time it changes)
      model.stateChanged.connect(() => {
        if (model.approvals !== marked) {
          marked = model.approvals;
          marks.pending(pendingCells(marked));
        }
      });
    }
    // A notification for each new request (Review opens the panel); it goes when the request is decided.
    const notices = new Map<number, string>();
    model.asked.connect((_, approval) => {
      notices.set(
        approval.id,
        Notification.info(asked(approval), {
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
    const panel = new AgentPanel(model, app.commands, focus);
    panel.title.icon = ICON;
    panel.disposed.connect(() => {
      model.dispose();
      marks?.dispose();
      follower?.dispose();
      focus?.dispose();
    });
    addCommands(app, model, panel, tracker, palette, focus);
    app.shell.add(panel, 'left', { rank: 600 });
    // A URL naming a request (?agent-approval=12, what an MCP client opens) shows it in the panel.
    router?.register({
      command: CommandIds.openApproval,
      pattern: APPROVAL_URL_PATTERN
    });
    restorer?.add(panel, 'jp-agent-activity');
    if (settings) {
      const apply = (loaded: ISettingRegistry.ISettings) => {
        if (marks) {
          marks.enabled = loaded.get('marks').composite as boolean;
        }
        model.maxChanges = loaded.get('maxChanges').composite as number;
      };
      settings
        .load(PLUGIN_ID)
        .then(loaded => {
          apply(loaded);
          loaded.changed.connect(apply);
        })
        .catch(reason =>
          console.error('jupyter-agent-tools: settings not loaded', reason)
        );
    }
  }
};

export default plugin;
