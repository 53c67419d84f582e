/**
 * The "Agents" sidebar panel: sessions, runs in progress and recent changes, as the server's routes
 * and events say them. Hooks for tests and automation (docs/panel.md): the root's id
 * `jp-agent-activity`, rows' `data-session` / `data-run` / `data-change-id`, buttons' `data-action`.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import {
  ApiError,
  EventStream,
  EXECUTION_EVENT,
  IAgentEvent,
  IChange,
  IChangeDetail,
  ISession,
  LEDGER_CHANGE_EVENT,
  notebookUrl,
  request,
  SESSION_EVENT
} from './api';
import { trans } from './i18n';
import { CellMarks } from './marks';

/** What the panel asks of the application around it. */
export interface IPanelHost {
  /** Open a notebook (at a cell, when given). */
  open(path: string, cellId: string | null): Promise<void>;
  /** The cell marks of open notebooks, if there is a notebook tracker. */
  marks: CellMarks | null;
}

export class AgentPanel extends Widget {
  constructor(private readonly host: IPanelHost) {
    super();
    this.id = 'jp-agent-activity';
    this.addClass('jp-AgentActivity');
    this.title.caption = trans.__('Agents: what AI agents do in this server');
    this.node.dataset.connected = 'false';
    this.node.addEventListener('click', event => this._click(event));
    this._events = new EventStream(
      event => this._event(event),
      connected => this._connection(connected)
    );
    this._render();
    this._events.start();
  }

  /** How many changes the list shows (the `maxChanges` setting). */
  set maxChanges(value: number) {
    if (value !== this._maxChanges) {
      this._maxChanges = value;
      void this._loadChanges();
    }
  }

  dispose(): void {
    this._events.dispose();
    clearInterval(this._ticker);
    super.dispose();
  }

  // -- what the server says -------------------------------------------------------------------

  private _connection(connected: boolean): void {
    this._connected = connected;
    this.node.dataset.connected = String(connected);
    if (connected) {
      // (Re)connected: what happened while the panel was not listening is read once.
      void this._loadSessions();
      void this._loadChanges();
    } else {
      this._render();
    }
  }

  private _event(event: IAgentEvent): void {
    switch (event.schema_id) {
      case SESSION_EVENT: // a call queued, started, at a cell, ended; a session created or gone
      case EXECUTION_EVENT:
        this._sessionsSoon();
        break;
      case LEDGER_CHANGE_EVENT:
        this._recorded(event as unknown as IChange & IAgentEvent);
        break;
    }
  }

  private _recorded(event: IChange & IAgentEvent): void {
    const change: IChange = { ...event, id: String(event.change_id) };
    this._arrived.delete(change.id);
    this._arrived.set(change.id, change);
    if (this._arrived.size > this._maxChanges) {
      this._arrived.delete(this._arrived.keys().next().value as string);
    }
    this._changes = [
      change,
      ...this._changes.filter(c => c.id !== change.id)
    ].slice(0, this._maxChanges);
    this.host.marks?.changed(change, describeChange(change));
    this._render();
  }

  /** Sessions are read again once per burst of events (a call's start, end, queue). */
  private _sessionsSoon(): void {
    clearTimeout(this._sessionsTimer);
    this._sessionsTimer = setTimeout(() => void this._loadSessions(), 50);
  }

  private async _loadSessions(): Promise<void> {
    try {
      const answer = await request<{ sessions: ISession[] }>(
        'api/agent/sessions'
      );
      this._sessions = answer.sessions;
      this._error = '';
      // The cell each notebook run runs, marked in the open notebook.
      const running = new Map<string, string | null>();
      for (const path of this._running) {
        running.set(path, null);
      }
      for (const s of this._sessions) {
        if (s.notebook && s.busy && s.running_cell?.cell_id) {
          running.set(s.notebook, s.running_cell.cell_id);
        }
      }
      this._running = new Set();
      for (const [path, cellId] of running) {
        this.host.marks?.running(path, cellId);
        if (cellId) {
          this._running.add(path);
        }
      }
    } catch (error) {
      this._error = `Sessions: ${(error as Error).message}`;
    }
    this._render();
  }

  private async _loadChanges(): Promise<void> {
    // Changes that arrive as events while the list is read may be newer than the list's answer (it can
    // reach the page after them): they are kept in front of it.
    const arrived = (this._arrived = new Map<string, IChange>());
    try {
      const answer = await request<{ changes: IChange[] }>(
        `api/agent/changes?limit=${this._maxChanges}`
      );
      const listed = new Set(answer.changes.map(c => c.id));
      this._changes = [
        ...[...arrived.values()].reverse().filter(c => !listed.has(c.id)),
        ...answer.changes
      ].slice(0, this._maxChanges);
    } catch (error) {
      this._error = `Changes: ${(error as Error).message}`;
    }
    this._render();
  }

  // -- what the person asks -------------------------------------------------------------------

  private _click(event: MouseEvent): void {
    const button = (event.target as HTMLElement).closest<HTMLElement>(
      'button[data-action]'
    );
    if (!button || !this.node.contains(button)) {
      return;
    }
    const row = button.closest<HTMLElement>(
      '[data-session], [data-run], [data-change-id]'
    );
    const action = button.dataset.action;
    const session = row?.dataset.session ?? row?.dataset.run;
    const change = this._changes.find(c => c.id === row?.dataset.changeId);
    const found = this._sessions.find(s => s.name === session);
    if ((action === 'interrupt' || action === 'stop') && found) {
      void this._act(button, () => this._sessionAction(action, found));
    } else if (change && action === 'undo') {
      void this._act(button, () => this._undo(change));
    } else if (change && action === 'diff') {
      void this._act(button, () => this._diff(change));
    } else if (change && action === 'open') {
      const cell = change.cells.find(c => c.id && !c.what.includes('deleted'));
      void this._act(button, () =>
        this.host.open(change.path, cell?.id ?? null)
      );
    }
  }

  private async _act(
    button: HTMLElement,
    action: () => Promise<void>
  ): Promise<void> {
    button.setAttribute('disabled', '');
    try {
      await action();
    } finally {
      button.removeAttribute('disabled');
    }
  }

  private async _sessionAction(
    action: string,
    session: ISession
  ): Promise<void> {
    const name = session.name;
    const path = `api/agent/sessions/${encodeURIComponent(name)}`;
    try {
      if (action === 'stop') {
        const answer = await showDialog({
          title: `Stop session ${name}?`,
          body: trans.__(
            'Its kernel is shut down: its variables are lost, a running call is cancelled.'
          ),
          buttons: [
            Dialog.cancelButton(),
            Dialog.warnButton({ label: trans.__('Stop') })
          ]
        });
        if (!answer.button.accept) {
          return;
        }
        await request(path, { method: 'DELETE' });
      } else if (session.mode === 'notebook' && session.kernel_id) {
        // A notebook run runs in the notebook's own kernel: interrupted as JupyterLab does it.
        await request(`api/kernels/${session.kernel_id}/interrupt`, {
          method: 'POST'
        });
      } else {
        await request(`${path}/interrupt`, { method: 'POST' });
      }
      this._notice = '';
    } catch (error) {
      this._notice = `${name}: ${(error as Error).message}`;
    }
    await this._loadSessions();
  }

  private async _undo(change: IChange): Promise<void> {
    this._problems.delete(change.id);
    try {
      const answer = await request<{ message: string }>(
        `${notebookUrl(change.path)}/changes/${change.id}/undo`,
        { method: 'POST', body: '{}' }
      );
      this._notice = answer.message;
    } catch (error) {
      this._problems.set(change.id, readable(error));
    }
    this._render();
  }

  private async _diff(change: IChange): Promise<void> {
    let detail: IChangeDetail;
    try {
      detail = await request<IChangeDetail>(
        `${notebookUrl(change.path)}/changes/${change.id}`
      );
    } catch (error) {
      this._problems.set(change.id, readable(error));
      this._render();
      return;
    }
    await showDialog({
      title: `Change ${change.id} of ${change.path}: ${change.action}`,
      body: new Widget({ node: diffNode(detail) }),
      buttons: [Dialog.okButton({ label: trans.__('Close') })]
    });
  }

  // -- rendering ------------------------------------------------------------------------------

  private _render(): void {
    const node = this.node;
    node.replaceChildren();
    const header = el('div', 'jp-AgentActivity-header');
    header.append(
      el('h2', 'jp-AgentActivity-title', 'Agents'),
      el(
        'span',
        'jp-AgentActivity-status',
        this._connected ? 'live' : 'reconnecting…'
      )
    );
    node.append(header);
    for (const text of [this._error, this._notice]) {
      if (text) {
        node.append(el('div', 'jp-AgentActivity-notice', text));
      }
    }
    node.append(
      this._section('Sessions', this._sessionRows(), 'No agent sessions.'),
      this._section('Runs in progress', this._runRows(), 'Nothing running.'),
      this._section('Recent changes', this._changeRows(), 'No changes yet.')
    );
    const running = this._sessions.some(s => s.busy);
    if (running && this._ticker === undefined) {
      this._ticker = setInterval(() => this._tick(), 1000); // elapsed times only
    } else if (!running && this._ticker !== undefined) {
      clearInterval(this._ticker);
      this._ticker = undefined;
    }
  }

  private _tick(): void {
    this.node
      .querySelectorAll<HTMLElement>('[data-since]')
      .forEach(cell => (cell.textContent = elapsed(cell.dataset.since!)));
  }

  private _section(title: string, rows: HTMLElement[], empty: string) {
    const section = el('section', 'jp-AgentActivity-section');
    section.dataset.section = title.toLowerCase().replace(/ /g, '-');
    section.append(el('h3', 'jp-AgentActivity-sectionTitle', title));
    const list = el('ul', 'jp-AgentActivity-list');
    list.append(...rows);
    section.append(
      rows.length ? list : el('div', 'jp-AgentActivity-empty', empty)
    );
    return section;
  }

  private _sessionRows(): HTMLElement[] {
    return this._sessions
      .filter(s => s.mode !== 'notebook') // a notebook's own kernel shows as its run
      .map(s => {
        const row = el('li', 'jp-AgentActivity-row');
        row.dataset.session = s.name;
        const state = s.busy ? 'busy' : s.state;
        row.append(
          line(
            el('strong', 'jp-AgentActivity-name', s.notebook ?? s.name),
            el('span', `jp-AgentActivity-state jp-mod-${state}`, state)
          ),
          line(
            text(`${s.owner ?? 'unknown'} · ${s.mode}`),
            text(`${s.queue_depth} queued`),
            text(`active ${when(s.last_used)}`)
          ),
          buttons(['interrupt', 'Interrupt'], ['stop', 'Stop'])
        );
        return row;
      });
  }

  private _runRows(): HTMLElement[] {
    return this._sessions
      .filter(s => s.busy)
      .map(s => {
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
              s.notebook ?? `eval: ${s.name}`
            ),
            since
          ),
          line(
            text(runningCell(s)),
            text(s.queue_depth ? `${s.queue_depth} queued` : '')
          ),
          buttons(['interrupt', 'Interrupt'])
        );
        return row;
      });
  }

  private _changeRows(): HTMLElement[] {
    return this._changes.map(c => {
      const row = el('li', 'jp-AgentActivity-row jp-AgentActivity-change');
      row.dataset.changeId = c.id;
      row.title = describeChange(c);
      const cells = c.cells
        .map(cell => `${cell.id ?? '?'} (${cell.what.join(', ')})`)
        .join(', ');
      const actions: [string, string][] = [
        ['open', 'Open'],
        ['diff', 'Diff']
      ];
      if (c.undoable) {
        actions.push(['undo', 'Undo']);
      }
      row.append(
        line(el('strong', 'jp-AgentActivity-name', c.path), text(`#${c.id}`)),
        line(text(c.action)),
        line(
          text(`${c.user ?? 'unknown'} via ${c.via ?? '?'}`),
          text(when(c.time))
        ),
        el('div', 'jp-AgentActivity-cells', cells ? `cells: ${cells}` : ''),
        buttons(...actions)
      );
      const problem = this._problems.get(c.id);
      if (problem) {
        const box = el('div', 'jp-AgentActivity-problem', problem);
        box.setAttribute('role', 'alert');
        row.append(box);
      }
      return row;
    });
  }

  private _events: EventStream;
  private _connected = false;
  private _arrived = new Map<string, IChange>(); // told by events since the list was last read
  private _sessions: ISession[] = [];
  private _changes: IChange[] = [];
  private _running = new Set<string>(); // notebooks with a cell marked running
  private _problems = new Map<string, string>();
  private _maxChanges = 20;
  private _error = '';
  private _notice = '';
  private _sessionsTimer: ReturnType<typeof setTimeout> | undefined;
  private _ticker: ReturnType<typeof setInterval> | undefined;
}

/** The tooltip of a change: who, via which door, when, what. */
export function describeChange(c: IChange): string {
  const time = new Date(c.time).toLocaleString();
  return `Changed by ${c.user ?? 'an unknown user'} via ${c.via ?? 'an unknown door'} at ${time}: ${c.action} (change ${c.id})`;
}

/** Which cell a busy session runs, as the sessions list says it. */
function runningCell(s: ISession): string {
  const cell = s.running_cell;
  if (!cell) {
    return 'starting';
  }
  if (s.notebook) {
    return `running cell ${cell.cell_id ?? `#${cell.index + 1}`}`;
  }
  return `running cell ${cell.index + 1}${cell.of ? ` of ${cell.of}` : ''}`;
}

/** An error as the person reads it: the server's message, and each conflicting cell. */
function readable(error: unknown): string {
  if (!(error instanceof ApiError)) {
    return String(error);
  }
  const conflicts: { id: string; what: string }[] = error.body?.conflicts ?? [];
  const lines = conflicts
    .map(c => `cell ${c.id}: ${c.what}`)
    .filter(line => !error.message.includes(line));
  const head = error.status === 409 ? 'Cannot undo. ' : '';
  return [head + error.message, ...lines].join('\n');
}

function diffNode(detail: IChangeDetail): HTMLElement {
  const root = el('div', 'jp-AgentActivity-diff');
  root.append(
    el(
      'div',
      'jp-AgentActivity-diffHeader',
      `${detail.user ?? 'unknown'} via ${detail.via ?? '?'}, ${when(detail.time)}`
    )
  );
  for (const cell of detail.cells) {
    root.append(
      el('h4', '', `cell ${cell.id ?? '?'}: ${cell.what.join(', ')}`)
    );
    const pre = el('pre', 'jp-AgentActivity-diffText');
    const diff =
      cell.diff ??
      [
        cell.before ? `before: ${JSON.stringify(cell.before, null, 1)}` : '',
        cell.after ? `after: ${JSON.stringify(cell.after, null, 1)}` : ''
      ]
        .filter(Boolean)
        .join('\n');
    for (const textLine of diff.split('\n')) {
      const kind = textLine.startsWith('+')
        ? 'jp-mod-added'
        : textLine.startsWith('-')
          ? 'jp-mod-removed'
          : '';
      pre.append(el('span', kind, `${textLine}\n`));
    }
    root.append(pre);
  }
  return root;
}

function el(tag: string, className: string, content = ''): HTMLElement {
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

function when(iso: string): string {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 60) {
    return 'just now';
  }
  if (seconds < 3600) {
    return `${Math.floor(seconds / 60)} min ago`;
  }
  return new Date(iso).toLocaleString();
}

function elapsed(iso: string): string {
  const seconds = Math.max(
    0,
    Math.floor((Date.now() - Date.parse(iso)) / 1000)
  );
  const m = Math.floor(seconds / 60);
  return m ? `${m} min ${seconds % 60} s` : `${seconds} s`;
}
