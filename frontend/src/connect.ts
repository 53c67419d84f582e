/**
 * "Connect an agent": the person makes an agent token where they are. A form (name, scopes, paths, what
 * the agent asks first, lifetime) POSTs `/api/agent/tokens`; the server's refusal is shown in the form
 * again, as it said it; the new token is shown this once, with what an agent needs to connect through
 * this server's URL as the page reaches it (the command line, an MCP client, curl) and the server's
 * warnings. The form and the answer are drawn by tokenviews.ts.
 */
import { Clipboard, Dialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { ICreatedToken } from './api';
import { readable } from './format';
import { TranslationBundle } from '@jupyterlab/translation';
import { IAgentModel } from './agentModel';
import { emptyForm, ITokenForm, tokenRequest } from './tokens';
import { createdNode, TokenForm } from './tokenviews';

/**
 * Ask for a new token until the server makes one (each refusal shown in the form, what was typed kept)
 * or the person cancels; then show it. The created token, or null.
 */
export async function connectAgent(
  trans: TranslationBundle,
  model: IAgentModel,
  baseUrl: string
): Promise<ICreatedToken | null> {
  await model.loadTokens(); // (the server's cap on a lifetime, as it is now)
  const choices = {
    ...(await model.tokenChoices()),
    maxLifetime: model.tokenLimit
  };
  let form = emptyForm(choices.maxLifetime);
  let problem = '';
  for (;;) {
    const answer = await launch<ITokenForm>({
      title: trans.__('Connect an agent'),
      body: new TokenForm(trans, choices, form, problem),
      buttons: [
        Dialog.cancelButton(),
        Dialog.okButton({ label: trans.__('Create token') })
      ],
      focusNodeSelector: 'input[data-field="name"]'
    });
    if (!answer.button.accept || !answer.value) {
      return null;
    }
    form = answer.value;
    let created: ICreatedToken;
    try {
      created = await model.createToken(tokenRequest(form));
    } catch (error) {
      problem = readable(trans, error);
      continue;
    }
    await showCreated(trans, created, baseUrl);
    return created;
  }
}

/** The new token, shown this once, with how to connect an agent and the server's warnings. */
export function showCreated(
  trans: TranslationBundle,
  created: ICreatedToken,
  baseUrl: string
): Promise<unknown> {
  return launch({
    title: trans.__("Agent token '%1' created", created.name),
    body: new Widget({
      node: createdNode(trans, created, baseUrl, text =>
        Clipboard.copyToSystem(text)
      )
    }),
    buttons: [Dialog.okButton({ label: trans.__('Done') })],
    hasClose: false // (Escape or a click outside would lose the token unseen)
  });
}

/** `showDialog`, in a taller and wider box than the default (the configuration's lines are long). */
function launch<T>(
  options: Partial<Dialog.IOptions<T>>
): Promise<Dialog.IResult<T>> {
  const dialog = new Dialog<T>(options);
  dialog.addClass('jp-AgentTokens-dialog');
  return dialog.launch();
}
