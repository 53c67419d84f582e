/**
 * The "Agents" sidebar panel: sessions, runs in progress and recent changes, rendered from the model
 * (`AgentModel`): a row is redrawn only when what it shows changed. Its buttons run the extension's
 * commands. Hooks for tests and automation (docs/panel.md): the root's id `jp-agent-activity`, rows'
 * `data-session` / `data-run` / `data-change-id`, buttons' `data-action`.
 */
import { CommandRegistry } from '@lumino/commands';
import { Widget } from '@lumino/widgets';

import { IChange, ISession } from './api';
import {
  changedCells,
  describeChange,
  elapsed,
  runningCell,
  when
} from './format';
import { trans } from './i18n';
import { AgentModel } from './model';

/** The command each button of a row runs (see index.ts). */
export const COMMANDS: { [action: string]: string } = {
  interrupt: 'agents:interrupt',
  stop: 'agents:stop',
  open: 'agents:open-change',
  diff: 'agents:diff',
  undo: 'agents:undo'
};

export class AgentPanel extends Widget {
  constructor(
    private readonly model: AgentModel,
    private readonly commands: CommandRegistry
  ) {
    super();
    this.id = 'jp-agent-activity';
    this.addClass('jp-AgentActivity');
    this.title.caption = trans.__('Agents: what AI agents do in this server');
    this.node.addEventListener('click', this._onClick);
    const header = el('div', 'jp-AgentActivity-header');
    header.append(
      el('h2', 'jp-AgentActivity-title', trans.__('Agents')),
      this._status
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
    this.node.append(
      header,
      this._error,
      this._notice,
      this._sessions.node,
      this._runs.node,
      this._changes.node
    );
    model.stateChanged.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.model.stateChanged.disconnect(this._render, this);
    this.node.removeEventListener('click', this._onClick);
    clearInterval(this._ticker);
    super.dispose();
  }

  private _onClick = (event: MouseEvent): void => {
    const button = (event.target as HTMLElement).closest<HTMLElement>(
      'button[data-action]'
    );
    if (!button || !this.node.contains(button)) {
      return;
    }
    const row = button.closest<HTMLElement>(
      '[data-session], [data-run], [data-change-id]'
    );
    const command = COMMANDS[button.dataset.action ?? ''];
    if (!row || !command) {
      return;
    }
    const session = row.dataset.session ?? row.dataset.run;
    const change = this.model.change(row.dataset.changeId ?? '');
    const args = session
      ? { session }
      : change
        ? { path: change.path, id: change.id }
        : null;
    if (!args) {
      return;
    }
    button.setAttribute('disabled', '');
    void this.commands
      .execute(command, args)
      .catch(error => console.error(error))
      .then(() => button.removeAttribute('disabled'));
  };

  private _render(): void {
    const model = this.model;
    this.node.dataset.connected = String(model.connected);
    this._status.textContent = model.connected
      ? trans.__('live')
      : trans.__('reconnecting…');
    show(this._error, model.error);
    show(this._notice, model.notice?.text ?? '');
    this._notice.classList.toggle('jp-mod-ok', model.notice?.ok ?? false);
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
    const running = sessions.some(s => s.busy);
    if (running && this._ticker === undefined) {
      this._ticker = setInterval(() => this._tick(), 1000); // elapsed times only
    } else if (!running && this._ticker !== undefined) {
      clearInterval(this._ticker);
      this._ticker = undefined;
    }
  }

  private _tick(): void {
    const now = Date.now();
    this.node
      .querySelectorAll<HTMLElement>('[data-since]')
      .forEach(cell => (cell.textContent = elapsed(cell.dataset.since!, now)));
  }

  private _status = el('span', 'jp-AgentActivity-status');
  private _error = el('div', 'jp-AgentActivity-notice jp-mod-error');
  private _notice = el('div', 'jp-AgentActivity-notice');
  private _sessions: Section;
  private _runs: Section;
  private _changes: Section;
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

function buttons(...actions: [string, string][]): HTMLElement {
  const node = el('div', 'jp-AgentActivity-actions');
  for (const [action, label] of actions) {
    const button = el('button', 'jp-Button jp-mod-minimal jp-mod-small', label);
    button.dataset.action = action;
    node.append(button);
  }
  return node;
}
