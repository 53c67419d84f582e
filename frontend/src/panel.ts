/**
 * The "Agents" sidebar panel: the requests waiting for the person's decision, sessions, runs in progress
 * and recent changes, rendered from the model (`IAgentModel`): the lists are `VDomRenderer`s (lists.tsx).
 * Its buttons run the extension's commands; the sidebar tab shows how many requests wait. Hooks
 * for tests and automation (docs/panel.md): the root's id `jp-agent-activity`, rows' `data-approval-id`
 * / `data-session` / `data-run` / `data-change-id`, buttons' `data-action`.
 */
import { CommandRegistry } from '@lumino/commands';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';
import { Message } from '@lumino/messaging';
import { PanelLayout, Widget } from '@lumino/widgets';

import { when } from './format';
import { parseAgents, sharedWith } from './focus';
import { nullTranslator, TranslationBundle } from '@jupyterlab/translation';
import { DOMAIN } from './i18n';
import type { FocusSharer } from './share';
import { IAgentModel } from './agentModel';
import {
  approvalRow,
  changeRow,
  IListOptions,
  ListSection,
  runRow,
  sessionRow,
  tokenRow
} from './lists';

/** The command each button of a row runs (see index.ts). */
export const COMMANDS: { [action: string]: string } = {
  interrupt: 'agents:interrupt',
  stop: 'agents:stop',
  open: 'agents:open-change',
  diff: 'agents:diff',
  undo: 'agents:undo',
  approve: 'agents:approve',
  'approve-for': 'agents:approve',
  deny: 'agents:deny',
  connect: 'agents:connect-agent',
  revoke: 'agents:revoke-token',
  'share-focus': 'agents:share-focus'
};

/** "Approve for 10 minutes": this agent, this action, this notebook. */
export const APPROVE_FOR_SECONDS = 600;

/** The sidebar tab's attribute (`data-agent-pending`) with the number of requests waiting. */
export const PENDING_DATASET_KEY = 'agent-pending';

/** The panel's id (its node's, and its sidebar tab's `data-id`). */
export const PANEL_ID = 'jp-agent-activity';

export class AgentPanel extends Widget {
  constructor(
    private readonly model: IAgentModel,
    private readonly commands: CommandRegistry,
    private readonly focus: FocusSharer | null = null,
    private readonly trans: TranslationBundle = nullTranslator.load(DOMAIN)
  ) {
    super();
    this.id = PANEL_ID;
    this.addClass('jp-AgentActivity');
    this.title.caption = this.trans.__(
      'Agents: what AI agents do in this server'
    );
    this.node.addEventListener('click', this._onClick);
    const header = el('div', 'jp-AgentActivity-header');
    this._connect.dataset.action = 'connect';
    this._connect.title = this.trans.__(
      'Make a token for an agent: its scopes, paths, what it asks you first'
    );
    header.append(
      el('h2', 'jp-AgentActivity-title', this.trans.__('Agents')),
      this._status,
      this._connect
    );
    const top = (this._top = new Widget());
    top.node.append(header, this._error, this._notice);
    // "Share my focus" below what waits for the person (which stays on top)
    this._focus = new Widget({ node: this._focusNode() });
    this._approvals = new ListSection(model, {
      name: 'waiting-for-you',
      title: trans.__('Waiting for you'),
      rows: m =>
        m.approvals.map(a => approvalRow(trans, a, this._reveal(a.id))),
      empty: () => ({ text: '', warn: false }),
      hideEmpty: true
    });
    const sessions: IListOptions = {
      name: 'sessions',
      title: trans.__('Sessions'),
      // (a notebook's own kernel shows as its run)
      rows: m =>
        m.sessions
          .filter(s => s.mode !== 'notebook')
          .map(s => sessionRow(trans, s)),
      empty: () => ({ text: trans.__('No agent sessions.'), warn: false })
    };
    this._runs = new ListSection(model, {
      name: 'runs-in-progress',
      title: trans.__('Runs in progress'),
      rows: m => {
        const now = Date.now();
        return m.sessions.filter(s => s.busy).map(s => runRow(trans, s, now));
      },
      empty: () => ({ text: trans.__('Nothing running.'), warn: false })
    });
    const changes: IListOptions = {
      name: 'recent-changes',
      title: trans.__('Recent changes'),
      rows: m => m.changes.map(c => changeRow(trans, c, m.problems.get(c.id))),
      empty: () => ({ text: trans.__('No changes yet.'), warn: false })
    };
    // Agent tokens: the server's list, or why it cannot be listed (409: not enabled on this server,
    // said plainly: it is how the server is set up, not a failure).
    const tokens: IListOptions = {
      name: 'agent-tokens',
      title: trans.__('Agent tokens'),
      rows: m => (m.tokensProblem ? [] : m.tokens.map(t => tokenRow(trans, t))),
      empty: m =>
        m.tokensProblem
          ? { text: m.tokensProblem, warn: m.tokensEnabled }
          : {
              text: trans.__(
                'No agent tokens yet: Connect an agent… makes one.'
              ),
              warn: false
            }
    };
    this._lists = [
      this._approvals,
      new ListSection(model, sessions),
      this._runs,
      new ListSection(model, changes),
      new ListSection(model, tokens)
    ];
    const layout = (this.layout = new PanelLayout());
    for (const widget of [
      this._top,
      this._approvals,
      this._focus,
      ...this._lists.slice(1)
    ]) {
      layout.addWidget(widget);
    }
    model.stateChanged.connect(this._render, this);
    focus?.changed.connect(this._renderFocus, this);
    this._render();
    this._renderFocus();
  }

  /** "Share my focus": the toggle, whom it is shared with, and who read it (hidden without notebooks). */
  private _focusNode(): HTMLElement {
    const section = el('div', 'jp-AgentActivity-section jp-AgentFocus');
    section.dataset.section = 'share-focus';
    section.hidden = !this.focus;
    const label = el('label', 'jp-AgentFocus-toggle');
    this._focusToggle.type = 'checkbox';
    this._focusToggle.dataset.field = 'share-focus';
    label.append(this._focusToggle, text(this.trans.__('Share my focus')));
    label.title = this.trans.__(
      'Let agents read the notebook, cell and selection you look at in this tab (off by default)'
    );
    this._focusAgents.dataset.field = 'focus-agents';
    this._focusAgents.className = 'jp-mod-styled jp-AgentFocus-agents';
    this._focusAgents.placeholder = this.trans.__('all agents, or agent names');
    this._focusAgents.title = this.trans.__(
      'Agent token names, separated by commas; empty: every agent'
    );
    this._focusToggle.addEventListener('change', () => {
      void this.commands.execute(COMMANDS['share-focus'], {
        on: this._focusToggle.checked,
        agents: this._focusAgents.value
      });
    });
    this._focusAgents.addEventListener('change', () => {
      if (this.focus?.sharing) {
        void this.focus.share(parseAgents(this._focusAgents.value));
      }
    });
    section.append(label, this._focusAgents, this._focusStatus);
    return section;
  }

  private _renderFocus(): void {
    const focus = this.focus;
    if (!focus) {
      return;
    }
    this._focusToggle.checked = focus.sharing;
    const lines = [
      focus.sharing
        ? this.trans.__(
            'On: %1 can read the notebook, cell and selection you look at in this tab.',
            sharedWith(this.trans, focus.agents)
          )
        : this.trans.__('Off: agents cannot see what you look at.')
    ];
    if (focus.sharing && focus.lastRead) {
      lines.push(
        this.trans.__(
          'Read by %1 %2',
          focus.lastRead.agent,
          when(this.trans, focus.lastRead.at)
        )
      );
    }
    if (focus.problem) {
      lines.push(focus.problem);
    }
    this._focusStatus.textContent = lines.join(' ');
    this._focusStatus.classList.toggle('jp-mod-on', focus.sharing);
    this.node.dataset.sharingFocus = String(focus.sharing);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.model.stateChanged.disconnect(this._render, this);
    this.focus?.changed.disconnect(this._renderFocus, this);
    this.node.removeEventListener('click', this._onClick);
    clearInterval(this._ticker);
    super.dispose();
  }

  /** The token list is read again each time the panel is shown (no event tells a token's last use). */
  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this.model.loadTokens();
  }

  private _onClick = (event: MouseEvent): void => {
    const button = (event.target as HTMLElement).closest<HTMLElement>(
      'button[data-action]'
    );
    if (!button || !this.node.contains(button)) {
      return;
    }
    const row = button.closest<HTMLElement>(
      '[data-approval-id], [data-session], [data-run], [data-change-id], [data-token]'
    );
    const command = COMMANDS[button.dataset.action ?? ''];
    if (!command || (!row && button.dataset.action !== 'connect')) {
      return;
    }
    const args = row ? this._args(row, button.dataset.action!) : {};
    if (!args) {
      return;
    }
    button.setAttribute('disabled', '');
    void this.commands
      .execute(command, args)
      .catch(error => console.error(error))
      .then(() => button.removeAttribute('disabled'));
  };

  /** The arguments of a row's button's command. */
  private _args(
    row: HTMLElement,
    action: string
  ): ReadonlyPartialJSONObject | null {
    if (row.dataset.approvalId) {
      const id = Number(row.dataset.approvalId);
      if (action === 'deny') {
        const reason = row.querySelector<HTMLInputElement>(
          'input[data-field="reason"]'
        );
        return { id, reason: reason?.value.trim() ?? '' };
      }
      return action === 'approve-for'
        ? { id, for_seconds: APPROVE_FOR_SECONDS }
        : { id };
    }
    if (row.dataset.token) {
      return { name: row.dataset.token };
    }
    const session = row.dataset.session ?? row.dataset.run;
    if (session) {
      return { session };
    }
    const change = this.model.change(row.dataset.changeId ?? '');
    return change ? { path: change.path, id: change.id } : null;
  }

  /** Show request `id`: its row scrolled into view and marked, now or once the list has it. */
  reveal(id: number): void {
    this._revealing = id;
    this._approvals.update();
  }

  /** The ref of request `id`'s row: the row asked for is marked and scrolled to once drawn. */
  private _reveal(id: number): (node: HTMLElement | null) => void {
    return node => {
      if (node && id === this._revealing) {
        this._revealing = null;
        node.classList.add('jp-mod-revealed');
        node.scrollIntoView({ block: 'nearest' });
      }
    };
  }

  private _render(): void {
    const model = this.model;
    this.node.dataset.connected = String(model.connected);
    this._status.textContent = model.connected
      ? this.trans.__('live')
      : this.trans.__('reconnecting…');
    show(this._error, model.error);
    show(this._notice, model.notice?.text ?? '');
    this._notice.classList.toggle('jp-mod-ok', model.notice?.ok ?? false);
    this._badge(model.approvals.length);
    const sessions = model.sessions;
    this._connect.hidden = !!model.tokensProblem;
    const running = sessions.some(s => s.busy);
    if (running && this._ticker === undefined) {
      this._ticker = setInterval(() => this._tick(), 1000); // elapsed times only
    } else if (!running && this._ticker !== undefined) {
      clearInterval(this._ticker);
      this._ticker = undefined;
    }
  }

  /** The number of requests waiting, on the sidebar tab (a badge drawn by CSS) and in its caption. */
  private _badge(count: number): void {
    const title = this.title;
    if (String(count || '') === (title.dataset[PENDING_DATASET_KEY] ?? '')) {
      return;
    }
    const dataset = { ...title.dataset };
    delete dataset[PENDING_DATASET_KEY];
    if (count) {
      dataset[PENDING_DATASET_KEY] = String(count);
    }
    title.dataset = dataset;
    title.caption = count
      ? this.trans._n(
          'Agents: %1 request waiting for you',
          'Agents: %1 requests waiting for you',
          count
        )
      : this.trans.__('Agents: what AI agents do in this server');
  }

  private _tick(): void {
    this._runs.update(); // (the elapsed times)
  }

  private _focusToggle = document.createElement('input');
  private _focusAgents = document.createElement('input');
  private _focusStatus = el('div', 'jp-AgentFocus-status');
  private _status = el('span', 'jp-AgentActivity-status');
  private _error = el('div', 'jp-AgentActivity-notice jp-mod-error');
  private _approvals: ListSection;
  private _revealing: number | null = null;
  private _notice = el('div', 'jp-AgentActivity-notice');
  private _runs: ListSection;
  /** The header and the messages, above the lists. */
  private _top: Widget;
  private _focus: Widget;
  /** The lists (the layout's widgets): requests, sessions, runs, changes, agent tokens. */
  private _lists: ListSection[];
  private _connect = el(
    'button',
    'jp-Button jp-mod-small jp-mod-styled jp-mod-accept jp-AgentActivity-connect',
    this.trans.__('Connect an agent…')
  );
  private _ticker: ReturnType<typeof setInterval> | undefined;
}

function show(node: HTMLElement, content: string): void {
  node.textContent = content;
  node.hidden = !content;
}

export function el(tag: string, className: string, content = ''): HTMLElement {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  node.textContent = content;
  return node;
}

function text(content: string): HTMLElement {
  return el('span', 'jp-AgentActivity-field', content);
}
