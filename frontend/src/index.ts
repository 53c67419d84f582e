/**
 * jupyter-agent-tools' frontend: the "Agents" panel in the left sidebar of JupyterLab and Notebook 7,
 * and the marks on cells agents changed. It shows what the server's routes and events say.
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';

import { ITranslator } from '@jupyterlab/translation';

// The panel is in the sidebar from the start: activation needs these modules at once.
import { setTranslator } from './i18n';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { CellMarks } from './marks';
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
  optional: [INotebookTracker, ISettingRegistry, ILayoutRestorer, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker | null,
    settings: ISettingRegistry | null,
    restorer: ILayoutRestorer | null,
    translator: ITranslator | null
  ) => {
    if (translator) {
      setTranslator(translator);
    }
    const marks = tracker ? new CellMarks(tracker) : null;
    const panel = new AgentPanel({
      marks,
      open: async (path, cellId) => {
        const widget = await app.commands.execute('docmanager:open', { path });
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
    panel.title.icon = ICON;
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, 'jp-agent-activity');
    if (settings) {
      const apply = (loaded: ISettingRegistry.ISettings) => {
        if (marks) {
          marks.enabled = loaded.get('marks').composite as boolean;
        }
        panel.maxChanges = loaded.get('maxChanges').composite as number;
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
