/**
 * What the "Connect an agent" dialogs show (connect.ts runs them): the form of a new token, and the new
 * token with how to connect an agent. Hooks for tests (docs/panel.md): the form's `data-field`,
 * `data-scope`, `data-ask`; the answer's `data-snippet` boxes and their `data-copy` buttons.
 */
import type { Dialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { ICreatedToken } from './api';
import { TranslationBundle } from '@jupyterlab/translation';
import { el } from './panel';
import {
  askHint,
  expiries,
  ITokenChoices,
  ITokenForm,
  scopeHint,
  snippets
} from './tokens';

/** The form: its fields as the server names them. */
export class TokenForm
  extends Widget
  implements Dialog.IBodyWidget<ITokenForm>
{
  constructor(
    trans: TranslationBundle,
    choices: ITokenChoices,
    form: ITokenForm,
    problem: string
  ) {
    super();
    this.addClass('jp-AgentTokens-form');
    const node = this.node;
    if (problem) {
      const box = el('div', 'jp-AgentTokens-problem', problem);
      box.setAttribute('role', 'alert');
      node.append(box);
    }
    this._name.type = 'text';
    this._name.dataset.field = 'name';
    this._name.value = form.name;
    this._name.placeholder = trans.__('e.g. ci-bot');
    this._name.setAttribute('autocomplete', 'off');
    node.append(
      field(
        trans.__('Name'),
        this._name,
        trans.__(
          'The agent acts as agent:NAME (in the panel, the change ledger and the events).'
        )
      )
    );
    node.append(
      boxes(
        trans.__('Scopes'),
        choices.scopes,
        form.scopes,
        'scope',
        scope => scopeHint(trans, scope),
        this._scopes
      )
    );
    this._paths.dataset.field = 'paths';
    this._paths.rows = 3;
    this._paths.value = form.paths;
    this._paths.placeholder = trans.__('e.g. reports/**');
    node.append(
      field(
        trans.__('Paths (optional)'),
        this._paths,
        trans.__(
          'Globs of the files it reaches, one a line (* within a folder, ** across folders); none: every file. Outside them files answer 404.'
        )
      )
    );
    node.append(
      boxes(
        trans.__('Ask me first (optional)'),
        choices.ask,
        form.ask,
        'ask',
        action => askHint(trans, action),
        this._ask
      )
    );
    this._expires.dataset.field = 'expires';
    for (const expiry of expiries(trans, choices.maxLifetime ?? null)) {
      const option = el('option', '', expiry.label) as HTMLOptionElement;
      option.value = expiry.seconds === null ? '' : String(expiry.seconds);
      option.selected = expiry.seconds === form.expiresIn;
      this._expires.append(option);
    }
    node.append(field(trans.__('Expires in'), this._expires, ''));
  }

  getValue(): ITokenForm {
    const ticked = (inputs: HTMLInputElement[]) =>
      inputs.filter(input => input.checked).map(input => input.value);
    return {
      name: this._name.value,
      scopes: ticked(this._scopes),
      paths: this._paths.value,
      ask: ticked(this._ask),
      expiresIn: this._expires.value ? Number(this._expires.value) : null
    };
  }

  private _name = document.createElement('input');
  private _scopes: HTMLInputElement[] = [];
  private _paths = document.createElement('textarea');
  private _ask: HTMLInputElement[] = [];
  private _expires = document.createElement('select');
}

/** A labelled field with a hint under it. */
function field(label: string, input: HTMLElement, hint: string): HTMLElement {
  const node = el('label', 'jp-AgentTokens-field');
  node.append(el('span', 'jp-AgentTokens-label', label), input);
  if (hint) {
    node.append(el('span', 'jp-AgentTokens-hint', hint));
  }
  return node;
}

/** A group of checkboxes (`data-KIND="value"`), each with its hint; `into` gets the inputs. */
function boxes(
  legend: string,
  values: string[],
  checked: string[],
  kind: string,
  hint: (value: string) => string,
  into: HTMLInputElement[]
): HTMLElement {
  const node = el('fieldset', 'jp-AgentTokens-choices');
  node.append(el('legend', 'jp-AgentTokens-label', legend));
  for (const value of values) {
    const input = document.createElement('input');
    input.type = 'checkbox';
    input.value = value;
    input.dataset[kind] = value;
    input.checked = checked.includes(value);
    into.push(input);
    const label = el('label', 'jp-AgentTokens-choice');
    label.append(input, el('strong', '', value));
    const text = hint(value);
    if (text) {
      label.append(el('span', 'jp-AgentTokens-hint', text));
    }
    node.append(label);
  }
  return node;
}

/** What the answer dialog shows. */
export function createdNode(
  trans: TranslationBundle,
  created: ICreatedToken,
  baseUrl: string,
  copy: (text: string) => void
): HTMLElement {
  const root = el('div', 'jp-AgentTokens-created');
  for (const warning of created.warnings ?? []) {
    const box = el('div', 'jp-AgentTokens-warning', warning);
    box.setAttribute('role', 'alert');
    root.append(box);
  }
  const facts = [
    trans.__('It acts as %1', created.user),
    trans.__('scopes: %1', created.scopes.join(', ')),
    created.paths.length
      ? trans.__('paths: %1', created.paths.join(', '))
      : trans.__('every file'),
    created.ask.length
      ? trans.__('asks you before: %1', created.ask.join(', '))
      : '',
    created.expires
      ? trans.__('expires %1', new Date(created.expires).toLocaleString())
      : trans.__('never expires (until revoked)')
  ].filter(Boolean);
  root.append(el('p', 'jp-AgentTokens-facts', facts.join(' · ')));
  root.append(
    el(
      'p',
      'jp-AgentTokens-once',
      trans.__(
        'Copy it now: it is shown this once (the server keeps only its hash). Give it to the agent only.'
      )
    )
  );
  root.append(
    snippetBox(trans, 'token', trans.__('Token'), created.token, copy)
  );
  for (const { kind, title, text } of snippets(trans, baseUrl, created.token)) {
    root.append(snippetBox(trans, kind, title, text, copy));
  }
  root.append(
    el(
      'p',
      'jp-AgentTokens-hint',
      trans.__(
        "The URL is this server's as this page reaches it: the agent must reach it at that address too."
      )
    )
  );
  return root;
}

/** A titled box of text with its Copy button. */
function snippetBox(
  trans: TranslationBundle,
  kind: string,
  title: string,
  text: string,
  copy: (text: string) => void
): HTMLElement {
  const node = el('div', 'jp-AgentTokens-snippet');
  node.dataset.snippet = kind;
  const button = el(
    'button',
    'jp-Button jp-mod-small jp-mod-minimal',
    trans.__('Copy')
  );
  button.dataset.copy = kind;
  button.setAttribute('aria-label', trans.__('Copy: %1', title));
  let timer: ReturnType<typeof setTimeout> | undefined;
  button.addEventListener('click', () => {
    copy(text);
    button.textContent = trans.__('Copied');
    clearTimeout(timer);
    timer = setTimeout(() => (button.textContent = trans.__('Copy')), 2000);
  });
  const head = el('div', 'jp-AgentTokens-snippetHead');
  head.append(el('span', 'jp-AgentTokens-label', title), button);
  node.append(head, el('pre', 'jp-AgentTokens-code', text));
  return node;
}
