/**
 * The "Agents" sidebar panel: the requests waiting for the person's decision, sessions, runs in progress
 * and recent changes, rendered from the model (`AgentModel`): a row is redrawn only when what it shows
 * changed. Its buttons run the extension's commands; the sidebar tab shows how many requests wait. Hooks
 * for tests and automation (docs/panel.md): the root's id `jp-agent-activity`, rows' `data-approval-id`
 * / `data-session` / `data-run` / `data-change-id`, buttons' `data-action`.
 */
import { CommandRegistry } from '@lumino/commands';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IAgentToken, IApproval, IChange, ISession } from './api';
import {
  beyondBox,
  notebookOf,
  notShown,
  shown,
  unshownCount,
  visibleParts
} from './approvals';
import {
  changedCells,
  describeChange,
  diffLines,
  elapsed,
  runningCell,
  when
} from './format';
import { parseAgents, sharedWith } from './focus';
import { trans } from './i18n';
import type { FocusSharer } from './share';
import { AgentModel } from './model';
import { tokenKey } from './tokens';

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

export class AgentPanel extends Widget {
  constructor(
    private readonly model: AgentModel,
    private readonly commands: CommandRegistry,
    private readonly focus: FocusSharer | null = null
  ) {
    super();
    this.id = 'jp-agent-activity';
    this.addClass('jp-AgentActivity');
    this.title.caption = trans.__('Agents: what AI agents do in this server');
    this.node.addEventListener('click', this._onClick);
    const header = el('div', 'jp-AgentActivity-header');
    this._connect.dataset.action = 'connect';
    this._connect.title = trans.__(
      'Make a token for an agent: its scopes, paths, what it asks you first'
    );
    header.append(
      el('h2', 'jp-AgentActivity-title', trans.__('Agents')),
      this._status,
      this._connect
    );
    this._approvals = new Section(
      'waiting-for-you',
      trans.__('Waiting for you'),
      ''
    );
    this._sessions = new Section(
      'sessions',
      trans.__('Sessions'),
      trans.__('No agent sessions.')
    );
    this._runs = new Section(
      'runs-in-progress',
      trans.__('Runs in progress'),
      trans.__('Nothing running.')
    );
    this._changes = new Section(
      'recent-changes',
      trans.__('Recent changes'),
      trans.__('No changes yet.')
    );
    this._tokens = new Section(
      'agent-tokens',
      trans.__('Agent tokens'),
      trans.__('No agent tokens yet: Connect an agent… makes one.')
    );
    this.node.append(
      header,
      this._error,
      this._notice,
      this._approvals.node, // what waits for the person stays on top
      this._focusNode(),
      this._sessions.node,
      this._runs.node,
      this._changes.node,
      this._tokens.node
    );
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
    label.append(this._focusToggle, text(trans.__('Share my focus')));
    label.title = trans.__(
      'Let agents read the notebook, cell and selection you look at in this tab (off by default)'
    );
    this._focusAgents.dataset.field = 'focus-agents';
    this._focusAgents.className = 'jp-mod-styled jp-AgentFocus-agents';
    this._focusAgents.placeholder = trans.__('all agents, or agent names');
    this._focusAgents.title = trans.__(
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
        ? trans.__(
            'On: %1 can read the notebook, cell and selection you look at in this tab.',
            sharedWith(focus.agents)
          )
        : trans.__('Off: agents cannot see what you look at.')
    ];
    if (focus.sharing && focus.lastRead) {
      lines.push(
        trans.__('Read by %1 %2', focus.lastRead.agent, when(focus.lastRead.at))
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
    this._render();
  }

  private _render(): void {
    const model = this.model;
    this.node.dataset.connected = String(model.connected);
    this._status.textContent = model.connected
      ? trans.__('live')
      : trans.__('reconnecting…');
    show(this._error, model.error);
    show(this._notice, model.notice?.text ?? '');
    this._notice.classList.toggle('jp-mod-ok', model.notice?.ok ?? false);
    const approvals = model.approvals;
    this._approvals.update(
      approvals,
      a => String(a.id),
      a => a.id, // (a pending request does not change: drawn once, a typed reason kept)
      approvalRow
    );
    this._approvals.node.hidden = approvals.length === 0;
    const revealed = this._approvals.node.querySelector(
      `[data-approval-id="${this._revealing}"]`
    );
    if (revealed) {
      this._revealing = null;
      revealed.classList.add('jp-mod-revealed');
      revealed.scrollIntoView({ block: 'nearest' });
    }
    this._badge(approvals.length);
    const sessions = model.sessions;
    // What a row shows decides whether it is drawn again ("3 min ago" changes each minute).
    const minute = Math.floor(Date.now() / 60000);
    this._sessions.update(
      sessions.filter(s => s.mode !== 'notebook'), // a notebook's own kernel shows as its run
      s => s.name,
      s => [s, minute],
      sessionRow
    );
    this._runs.update(
      sessions.filter(s => s.busy),
      s => s.name,
      s => s,
      runRow
    );
    this._changes.update(
      model.changes,
      c => c.id,
      c => [c, model.problems.get(c.id), minute],
      c => changeRow(c, model.problems.get(c.id))
    );
    // Agent tokens: the server's list, or why it cannot be listed (409: not enabled on this server).
    this._tokens.update(
      model.tokensProblem ? [] : model.tokens,
      tokenKey,
      t => [t, minute],
      tokenRow
    );
    // (not enabled on this server: said plainly, it is how the server is set up, not a failure)
    this._tokens.empty(model.tokensProblem, model.tokensEnabled);
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
      ? trans._n(
          'Agents: %1 request waiting for you',
          'Agents: %1 requests waiting for you',
          count
        )
      : trans.__('Agents: what AI agents do in this server');
  }

  private _tick(): void {
    const now = Date.now();
    this.node
      .querySelectorAll<HTMLElement>('[data-since]')
      .forEach(cell => (cell.textContent = elapsed(cell.dataset.since!, now)));
  }

  private _focusToggle = document.createElement('input');
  private _focusAgents = document.createElement('input');
  private _focusStatus = el('div', 'jp-AgentFocus-status');
  private _status = el('span', 'jp-AgentActivity-status');
  private _error = el('div', 'jp-AgentActivity-notice jp-mod-error');
  private _approvals: Section;
  private _revealing: number | null = null;
  private _notice = el('div', 'jp-AgentActivity-notice');
  private _sessions: Section;
  private _runs: Section;
  private _changes: Section;
  private _tokens: Section;
  private _connect = el(
    'button',
    'jp-Button jp-mod-small jp-mod-styled jp-mod-accept jp-AgentActivity-connect',
    trans.__('Connect an agent…')
  );
  private _ticker: ReturnType<typeof setInterval> | undefined;
}

/** A row's node and what it was drawn from (it is drawn again only when that changes). */
interface IRow {
  node: HTMLElement;
  drawn: string;
}

/** A titled list whose rows are kept by key. */
class Section {
  constructor(name: string, title: string, empty: string) {
    this.node.className = 'jp-AgentActivity-section';
    this.node.dataset.section = name;
    this._empty.textContent = empty;
    this.node.append(el('h3', 'jp-AgentActivity-sectionTitle', title));
    this.node.append(this._empty);
    this._emptyText = empty;
  }

  /** What shows instead of the list when it is empty: `problem` (as a warning when `warn`), else the
   * usual text. */
  empty(problem: string, warn = true): void {
    this._empty.textContent = problem || this._emptyText;
    this._empty.classList.toggle('jp-AgentActivity-notice', !!problem && warn);
  }

  /** Show `items`; a row is drawn again only when its `shown(item)` changed. */
  update<T>(
    items: readonly T[],
    key: (item: T) => string,
    shown: (item: T) => unknown,
    draw: (item: T) => HTMLElement
  ) {
    const rows = new Map<string, IRow>();
    const nodes: HTMLElement[] = [];
    for (const item of items) {
      const k = key(item);
      const drawn = JSON.stringify(shown(item));
      let row = this._rows.get(k);
      if (!row || row.drawn !== drawn) {
        const node = draw(item);
        row?.node.replaceWith(node);
        row = { node, drawn };
      }
      rows.set(k, row);
      nodes.push(row.node);
    }
    this._rows = rows;
    // Moves only the rows out of place (a new change goes on top; the others stay).
    nodes.forEach((node, i) => {
      if (this._list.children[i] !== node) {
        this._list.insertBefore(node, this._list.children[i] ?? null);
      }
    });
    while (this._list.children.length > nodes.length) {
      this._list.lastElementChild!.remove();
    }
    const listed = nodes.length > 0;
    if (listed !== this._list.isConnected) {
      (listed ? this._empty : this._list).replaceWith(
        listed ? this._list : this._empty
      );
    }
  }

  readonly node = document.createElement('section');
  private _list = el('ul', 'jp-AgentActivity-list');
  private _empty = el('div', 'jp-AgentActivity-empty');
  private _rows = new Map<string, IRow>();
  private _emptyText: string;
}

function approvalRow(a: IApproval): HTMLElement {
  const row = el('li', 'jp-AgentActivity-row jp-AgentActivity-approval');
  row.dataset.approvalId = String(a.id);
  const reason = el('input', 'jp-AgentActivity-reason') as HTMLInputElement;
  reason.type = 'text';
  reason.dataset.field = 'reason';
  reason.placeholder = trans.__('Reason (optional, the agent is told)');
  reason.setAttribute('aria-label', trans.__('Reason for denying'));
  reason.maxLength = 1000;
  row.append(
    line(
      el('strong', 'jp-AgentActivity-name', a.agent),
      el('span', `jp-AgentActivity-state jp-mod-${a.action}`, a.action),
      text(`#${a.id}`)
    ),
    line(codeText(a.summary, 'jp-AgentActivity-summary', 'span')),
    line(
      text(notebookOf(a) ?? trans.__('no notebook')),
      text(trans.__('via %1', a.door))
    ),
    line(
      text(trans.__('asked %1, expires %2', clock(a.created), clock(a.expires)))
    ),
    approvalNode(a),
    reason,
    buttons(
      ['approve', trans.__('Approve'), 'jp-mod-styled jp-mod-accept'],
      ['approve-for', trans.__('Approve for 10 minutes'), 'jp-mod-styled'],
      ['deny', trans.__('Deny'), 'jp-mod-styled jp-mod-warn']
    )
  );
  if (a.preview) {
    // not approvable on a preview: the full request is being read
    row
      .querySelectorAll('button[data-action^="approve"]')
      .forEach(button => button.setAttribute('disabled', ''));
  }
  return row;
}

/** What a request would do, in full: each cell's code or diff (monospace, scrollable). */
export function approvalNode(a: IApproval): HTMLElement {
  const root = el('div', 'jp-AgentActivity-asked');
  const warning = notShown(a);
  if (warning) {
    root.append(el('div', 'jp-AgentActivity-notShown', warning));
  }
  for (const part of shown(a)) {
    if (part.title) {
      root.append(el('div', 'jp-AgentActivity-partTitle', part.title));
    }
    const hidden = unshownCount(part.text);
    if (hidden) {
      root.append(
        el(
          'div',
          'jp-AgentActivity-notShown',
          trans._n(
            '%1 control or invisible character is shown as a marked escape',
            '%1 control or invisible characters are shown as marked escapes',
            hidden
          )
        )
      );
    }
    root.append(
      part.diff
        ? diffText(part.text)
        : codeText(part.text, 'jp-AgentActivity-code')
    );
    const beyond = beyondBox(part.text);
    if (beyond) {
      root.append(el('div', 'jp-AgentActivity-beyond', beyond));
    }
  }
  return root;
}

/** Code in a box, each control or invisible character as a marked escape (never as itself). */
function codeText(text: string, className: string, tag = 'pre'): HTMLElement {
  const node = el(tag, className);
  appendVisible(node, text);
  return node;
}

function appendVisible(node: HTMLElement, text: string): void {
  for (const [piece, escaped] of visibleParts(text)) {
    node.append(
      escaped
        ? el('span', 'jp-AgentActivity-control', piece)
        : document.createTextNode(piece)
    );
  }
}

/** A unified diff, its added and removed lines marked. */
export function diffText(diff: string): HTMLElement {
  const pre = el('pre', 'jp-AgentActivity-code jp-AgentActivity-diffText');
  for (const [text, kind] of diffLines(diff)) {
    const line = el('span', kind ? `jp-mod-${kind}` : '');
    appendVisible(line, `${text}\n`);
    pre.append(line);
  }
  return pre;
}

/** An ISO time as the clock shows it (`14:03`). */
function clock(iso: string): string {
  return new Date(iso).toLocaleTimeString([], {
    hour: '2-digit',
    minute: '2-digit'
  });
}

function sessionRow(s: ISession): HTMLElement {
  const row = el('li', 'jp-AgentActivity-row');
  row.dataset.session = s.name;
  const state = s.busy ? 'busy' : s.state;
  row.append(
    line(
      el('strong', 'jp-AgentActivity-name', s.notebook ?? s.name),
      el(
        'span',
        `jp-AgentActivity-state jp-mod-${state}`,
        s.busy ? trans.__('busy') : state // (a kernel's state: the server's word)
      )
    ),
    line(
      text(`${s.owner ?? trans.__('unknown')} · ${s.mode}`),
      text(trans.__('%1 queued', s.queue_depth)),
      text(trans.__('active %1', when(s.last_used)))
    ),
    buttons(['interrupt', trans.__('Interrupt')], ['stop', trans.__('Stop')])
  );
  return row;
}

function runRow(s: ISession): HTMLElement {
  const row = el('li', 'jp-AgentActivity-row jp-AgentActivity-run');
  row.dataset.run = s.name;
  const since = el('span', 'jp-AgentActivity-elapsed');
  if (s.busy_since) {
    since.dataset.since = s.busy_since;
    since.textContent = elapsed(s.busy_since);
  }
  row.append(
    line(
      el(
        'strong',
        'jp-AgentActivity-name',
        s.notebook ?? trans.__('eval: %1', s.name)
      ),
      since
    ),
    line(
      text(runningCell(s)),
      text(s.queue_depth ? trans.__('%1 queued', s.queue_depth) : '')
    ),
    buttons(['interrupt', trans.__('Interrupt')])
  );
  return row;
}

function changeRow(c: IChange, problem: string | undefined): HTMLElement {
  const row = el('li', 'jp-AgentActivity-row jp-AgentActivity-change');
  row.dataset.changeId = c.id;
  row.title = describeChange(c);
  const cells = changedCells(c);
  const actions: [string, string][] = [
    ['open', trans.__('Open')],
    ['diff', trans.__('Diff')]
  ];
  if (c.undoable) {
    actions.push(['undo', trans.__('Undo')]);
  }
  row.append(
    line(el('strong', 'jp-AgentActivity-name', c.path), text(`#${c.id}`)),
    line(text(c.action)),
    line(
      text(
        trans.__(
          '%1 via %2',
          c.user ?? trans.__('unknown'),
          c.via ?? trans.__('?')
        )
      ),
      text(when(c.time))
    ),
    el(
      'div',
      'jp-AgentActivity-cells',
      cells ? trans.__('cells: %1', cells) : ''
    ),
    buttons(...actions)
  );
  if (problem) {
    const box = el('div', 'jp-AgentActivity-problem', problem);
    box.setAttribute('role', 'alert');
    row.append(box);
  }
  return row;
}
function tokenRow(t: IAgentToken): HTMLElement {
  const row = el('li', 'jp-AgentActivity-row jp-AgentActivity-token');
  row.dataset.token = t.name;
  row.dataset.status = t.status;
  row.append(
    line(
      el('strong', 'jp-AgentActivity-name', t.name),
      el('span', `jp-AgentActivity-state jp-mod-${t.status}`, t.status) // (the server's word)
    ),
    line(
      text(trans.__('scopes: %1', t.scopes.join(', '))),
      text(
        t.paths.length
          ? trans.__('paths: %1', t.paths.join(', '))
          : trans.__('every file')
      )
    )
  );
  if (t.ask.length) {
    row.append(line(text(trans.__('asks you before: %1', t.ask.join(', ')))));
  }
  row.append(
    line(
      text(
        t.status === 'revoked' && t.revoked
          ? trans.__('revoked %1', when(t.revoked))
          : t.expires
            ? trans.__('expires %1', new Date(t.expires).toLocaleString())
            : trans.__('never expires')
      ),
      text(
        t.last_used
          ? trans.__('last used %1', when(t.last_used))
          : trans.__('never used')
      )
    )
  );
  if (t.status === 'active') {
    row.append(buttons(['revoke', trans.__('Revoke')]));
  }
  return row;
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

function line(...parts: HTMLElement[]): HTMLElement {
  const node = el('div', 'jp-AgentActivity-line');
  node.append(...parts);
  return node;
}

/** A row's buttons: `[action, label]`, or `[action, label, classes]` instead of minimal ones. */
function buttons(
  ...actions: ([string, string] | [string, string, string])[]
): HTMLElement {
  const node = el('div', 'jp-AgentActivity-actions');
  for (const [action, label, classes] of actions) {
    const button = el(
      'button',
      `jp-Button jp-mod-small ${classes ?? 'jp-mod-minimal'}`,
      label
    );
    button.dataset.action = action;
    node.append(button);
  }
  return node;
}
