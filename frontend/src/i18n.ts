/**
 * The strings go through JupyterLab's translator: each plugin loads this domain from the application's
 * `ITranslator` (index.ts) and hands the bundle to what it makes; pure helpers take it as a parameter.
 */
import {
  ITranslator,
  nullTranslator,
  TranslationBundle
} from '@jupyterlab/translation';

/** The translation domain of the extension's strings. */
export const DOMAIN = 'jupyter_agent_tools';

/** The extension's strings in the application's language (as written, without a translator). */
export function translation(translator: ITranslator | null): TranslationBundle {
  return (translator ?? nullTranslator).load(DOMAIN);
}
