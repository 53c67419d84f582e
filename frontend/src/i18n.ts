/** The panel's strings go through JupyterLab's translator (the application's, once it is known). */
import {
  ITranslator,
  nullTranslator,
  TranslationBundle
} from '@jupyterlab/translation';

export let trans: TranslationBundle = nullTranslator.load(
  'jupyter_agent_tools'
);

export function setTranslator(translator: ITranslator): void {
  trans = translator.load('jupyter_agent_tools');
}
