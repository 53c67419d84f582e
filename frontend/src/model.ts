/**
 * What the frontend knows, all of it from the server's routes and events: the agents' sessions, the
 * recent changes, the connection to the event bus, the panel's messages. Views render it; commands act
 * through it.
 */
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import {
  Api,
  ApiError,
  APPROVAL_EVENT,
  changeOfEvent,
  EXECUTION_EVENT,
  IAgentEvent,
  IAgentToken,
  IApproval,
  IChange,
  IChangeDetail,
  ICreatedToken,
  IDecision,
  ISession,
  ITokenRequest,
  LEDGER_CHANGE_EVENT,
  SESSION_EVENT,
  writtenNotebook
} from './api';
import { PendingBook } from './approvals';
import type { IAgentModel } from './agentModel';
import type { IAgentEventSource } from './events';
import { readable, undone } from './format';
import { nullTranslator, TranslationBundle } from '@jupyterlab/translation';
import { DOMAIN } from './i18n';
import {
  DEFAULT_CHOICES,
  ITokenChoices,
  parseTokens,
  tokenLimit,
  tokenChoices
} from './tokens';

/** How long a message of success stays (it also goes at the next action). */
export const NOTICE_MS = 6000;

/** What the model reads and asks of the server (the `Api` class; a fake in tests). */
export type AgentApi = Pick<Api, keyof Api>;

export class AgentModel implements IAgentModel, IDisposable {
  /** `events` is the model's own: it goes with the model. */
  constructor(
    readonly api: AgentApi,
    private readonly events: IAgentEventSource,
    private readonly trans: TranslationBundle = nullTranslator.load(DOMAIN)
  ) {
    events.event.connect(this._onEvent, this);
    events.connection.connect(this._onConnection, this);
  }

  /** Every event of the bus (with a schema), as it arrives. */
  get event(): ISignal<this, IAgentEvent> {
    return this._event;
  }

  /** Anything shown changed. */
  get stateChanged(): ISignal<this, void> {
    return this._stateChanged;
  }

  /** A change the ledger recorded, as its event told it. */
  get recorded(): ISignal<this, IChange> {
    return this._recorded;
  }

  /** A notebook may have been written on disk (with its ledger change, when the event is one). */
  get written(): ISignal<this, { path: string; change: IChange | null }> {
    return this._written;
  }

  /** The cell a notebook run runs in a notebook (null: none any more). */
  get running(): ISignal<this, { path: string; cellId: string | null }> {
    return this._running;
  }

  /** A new request for the person's decision, told by its event (with its details). */
  get asked(): ISignal<this, IApproval> {
    return this._asked;
  }

  /** A request left the pending ones (decided, expired, withdrawn, or no longer listed). */
  get settled(): ISignal<this, number> {
    return this._settled;
  }

  /** The requests waiting for the person's decision, oldest first, with their details. */
  get approvals(): readonly IApproval[] {
    return this._pending.items;
  }

  get connected(): boolean {
    return this._connected;
  }
  get sessions(): readonly ISession[] {
    return this._sessions;
  }
  get changes(): readonly IChange[] {
    return this._changes;
  }
  /** The agent tokens, oldest first, as last read (none while `tokensProblem` says why). */
  get tokens(): readonly IAgentToken[] {
    return this._tokens;
  }
  /** Why the tokens cannot be listed, as the server said it, or ''. */
  /** The longest lifetime the server allows a new token, in seconds (null: no cap), as last read. */
  get tokenLimit(): number | null {
    return this._tokenLimit;
  }

  get tokensProblem(): string {
    return this._tokensProblem;
  }
  /** False when the server said agent tokens are not enabled on it (409: `tokensProblem` says how). */
  get tokensEnabled(): boolean {
    return this._tokensEnabled;
  }
  /** What could not be read (each list's last failure, until it is read again). */
  get error(): string {
    return [...new Set(this._errors.values())].join(' ');
  }
  /** The outcome of the person's last action: `{text, ok}`, or null. */
  get notice(): { text: string; ok: boolean } | null {
    return this._notice;
  }
  /** A change's refused undo or diff, by change id. */
  get problems(): ReadonlyMap<string, string> {
    return this._problems;
  }

  get maxChanges(): number {
    return this._maxChanges;
  }

  set maxChanges(value: number) {
    if (value !== this._maxChanges) {
      this._maxChanges = value;
      void this.loadChanges();
    }
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    clearTimeout(this._sessionsTimer);
    clearTimeout(this._noticeTimer);
    this.events.dispose();
    Signal.clearData(this);
  }

  session(name: string): ISession | undefined {
    return this._sessions.find(s => s.name === name);
  }

  change(id: string): IChange | undefined {
    return this._changes.find(c => c.id === id);
  }

  approval(id: number): IApproval | undefined {
    return this._pending.get(id);
  }

  // -- what the person asks ---------------------------------------------------------------------

  /** Run an action of the person's: the previous message goes; its outcome is the new one. */
  async act(
    action: () => Promise<string>,
    problemOf: string | null = null
  ): Promise<void> {
    this._setNotice(null);
    if (problemOf) {
      this._problems.delete(problemOf);
    }
    try {
      this._setNotice({ text: await action(), ok: true });
    } catch (error) {
      if (problemOf) {
        this._problems.set(problemOf, readable(this.trans, error));
        this._stateChanged.emit();
      } else {
        this._setNotice({ text: readable(this.trans, error), ok: false });
      }
    }
  }

  async interrupt(session: ISession): Promise<string> {
    await this.api.interrupt(session);
    void this.loadSessions();
    return '';
  }

  async stop(session: ISession): Promise<string> {
    await this.api.stop(session.name);
    await this.loadSessions();
    return '';
  }

  async undo(change: IChange): Promise<string> {
    return undone(
      this.trans,
      change,
      await this.api.undo(change.path, change.id)
    );
  }

  /** The person's decision on a request; it leaves the pending ones at once (its event follows). */
  async decide(approval: IApproval, decision: IDecision): Promise<string> {
    try {
      await this.api.decide(approval.id, decision);
    } catch (error) {
      if (error instanceof ApiError && [404, 409].includes(error.status)) {
        void this.loadApprovals(); // decided elsewhere, or expired: the list says how things are
      }
      throw error;
    }
    this._settle(approval.id);
    if (decision.decision === 'deny') {
      return this.trans.__('Denied: %1 (%2)', approval.summary, approval.agent);
    }
    return decision.for_seconds
      ? this.trans.__(
          'Approved: %1 (%2), and its like for %3 min',
          approval.summary,
          approval.agent,
          Math.round(decision.for_seconds / 60)
        )
      : this.trans.__('Approved: %1 (%2)', approval.summary, approval.agent);
  }

  /** A new agent token (the server's answer: the token, shown this once); the list is read again. */
  async createToken(request: ITokenRequest): Promise<ICreatedToken> {
    const created = await this.api.createToken(request);
    void this.loadTokens();
    return created;
  }

  /** Revoke the active token of that name; the list is read again (also when the server refused). */
  async revokeToken(name: string): Promise<string> {
    try {
      await this.api.revokeToken(name);
    } finally {
      void this.loadTokens();
    }
    return this.trans.__(
      "Revoked the agent token '%1': it is refused from now on.",
      name
    );
  }

  /** What a new token may have, from the server's contract (read once; the defaults without it). */
  tokenChoices(): Promise<ITokenChoices> {
    if (!this._choices) {
      this._choices = this.api.contract().then(tokenChoices, error => {
        this._choices = null; // (read again next time)
        console.warn(
          'jupyter-agent-tools: the token choices are the defaults',
          error
        );
        return DEFAULT_CHOICES;
      });
    }
    return this._choices;
  }

  detail(change: { path: string; id: string }): Promise<IChangeDetail> {
    return this.api.change(change.path, change.id);
  }

  // -- what the server says ---------------------------------------------------------------------

  async loadSessions(): Promise<void> {
    try {
      this._sessions = (await this.api.sessions()).sessions;
      this._errors.delete('sessions');
      // The cell each notebook run runs (null for a notebook whose run ended).
      const running = new Map<string, string | null>();
      for (const path of this._runningPaths) {
        running.set(path, null);
      }
      for (const s of this._sessions) {
        if (s.notebook && s.busy && s.running_cell?.cell_id) {
          running.set(s.notebook, s.running_cell.cell_id);
        }
      }
      this._runningPaths = new Set();
      for (const [path, cellId] of running) {
        if (cellId) {
          this._runningPaths.add(path);
        }
        this._running.emit({ path, cellId });
      }
    } catch (error) {
      this._errors.set('sessions', readable(this.trans, error));
    }
    this._stateChanged.emit();
  }

  async loadTokens(): Promise<void> {
    try {
      const answer = await this.api.tokens();
      this._tokens = parseTokens(answer);
      this._tokenLimit = tokenLimit(answer);
      this._tokensProblem = '';
      this._tokensEnabled = true;
    } catch (error) {
      this._tokens = [];
      this._tokensProblem = readable(this.trans, error);
      this._tokensEnabled = !(
        error instanceof ApiError && error.status === 409
      );
    }
    this._stateChanged.emit();
  }

  async loadChanges(): Promise<void> {
    // Changes that arrive as events while the list is read may be newer than the list's answer (it can
    // reach the page after them): they are kept in front of it.
    const arrived = (this._arrived = new Map<string, IChange>());
    try {
      const answer = await this.api.changes(this._maxChanges);
      const listed = new Set(answer.changes.map(c => c.id));
      this._changes = [
        ...[...arrived.values()].reverse().filter(c => !listed.has(c.id)),
        ...answer.changes
      ].slice(0, this._maxChanges);
      this._errors.delete('changes');
    } catch (error) {
      this._errors.set('changes', readable(this.trans, error));
    }
    this._stateChanged.emit();
  }

  async loadApprovals(): Promise<void> {
    const before = new Set(this._pending.items.map(a => a.id));
    this._pending.reading();
    try {
      this._pending.listed((await this.api.approvals()).pending);
      this._errors.delete('approvals');
    } catch (error) {
      this._errors.set('approvals', readable(this.trans, error));
    }
    const now = new Set(this._pending.items.map(a => a.id));
    for (const id of before) {
      if (!now.has(id)) {
        this._settled.emit(id);
      }
    }
    this._stateChanged.emit();
    await this._readInFull();
  }

  /** The list carries previews: each request shown only so is read in full, one at a time. */
  private async _readInFull(): Promise<void> {
    for (const listed of this._pending.items.filter(a => a.preview)) {
      if (this._disposed) {
        return;
      }
      try {
        if (this._pending.full(await this.api.approval(listed.id))) {
          this._stateChanged.emit();
        }
      } catch (error) {
        this._errors.set('approvals', readable(this.trans, error)); // (decided meanwhile: its event removes it)
        this._stateChanged.emit();
      }
    }
  }

  private _onConnection(_: unknown, connected: boolean): void {
    if (connected === this._connected) {
      return;
    }
    this._connected = connected;
    if (connected) {
      // (Re)connected: what happened while the page was not listening is read once.
      void this.loadSessions();
      void this.loadChanges();
      void this.loadApprovals();
      void this.loadTokens();
    }
    this._stateChanged.emit();
  }

  private _onEvent(_: unknown, event: IAgentEvent): void {
    this._event.emit(event);
    if (event.schema_id === LEDGER_CHANGE_EVENT) {
      this._onChange(changeOfEvent(event));
    } else if (event.schema_id === APPROVAL_EVENT) {
      void this._onApproval(event);
    } else if (
      event.schema_id === SESSION_EVENT ||
      event.schema_id === EXECUTION_EVENT
    ) {
      // a call queued, started, at a cell, ended; a session created or gone
      this._sessionsSoon();
    }
    const path = writtenNotebook(event);
    if (path !== null && event.schema_id !== LEDGER_CHANGE_EVENT) {
      this._written.emit({ path, change: null });
    }
  }

  private _onChange(change: IChange): void {
    this._arrived.delete(change.id);
    this._arrived.set(change.id, change);
    if (this._arrived.size > this._maxChanges) {
      this._arrived.delete(this._arrived.keys().next().value as string);
    }
    this._changes = [
      change,
      ...this._changes.filter(c => c.id !== change.id)
    ].slice(0, this._maxChanges);
    this._recorded.emit(change);
    this._written.emit({ path: change.path, change });
    this._stateChanged.emit();
  }

  /** A request was made (its details are read: the event has none) or decided. */
  private async _onApproval(event: IAgentEvent): Promise<void> {
    const id = Number(event.approval_id);
    if (!Number.isInteger(id)) {
      return;
    }
    if (event.event !== 'requested') {
      this._settle(id);
      return;
    }
    let approval: IApproval;
    try {
      approval = await this.api.approval(id);
    } catch (error) {
      this._errors.set('approvals', readable(this.trans, error));
      this._stateChanged.emit();
      return;
    }
    if (!this._disposed && this._pending.add(approval)) {
      this._asked.emit(approval);
      this._stateChanged.emit();
    }
  }

  private _settle(id: number): void {
    const listed = this._pending.remove(id);
    if (listed) {
      this._settled.emit(id);
      this._stateChanged.emit();
    }
  }

  /** Sessions are read again once per burst of events (a call's start, end, queue). */
  private _sessionsSoon(): void {
    clearTimeout(this._sessionsTimer);
    this._sessionsTimer = setTimeout(() => void this.loadSessions(), 50);
  }

  private _setNotice(notice: { text: string; ok: boolean } | null): void {
    clearTimeout(this._noticeTimer);
    this._notice = notice?.text ? notice : null;
    if (this._notice?.ok) {
      this._noticeTimer = setTimeout(() => this._setNotice(null), NOTICE_MS);
    }
    this._stateChanged.emit();
  }

  private _disposed = false;
  private _connected = false;
  private _arrived = new Map<string, IChange>(); // told by events since the list was last read
  private _sessions: ISession[] = [];
  private _pending = new PendingBook();
  private _changes: IChange[] = [];
  private _tokens: IAgentToken[] = [];
  private _tokensProblem = '';
  private _tokenLimit: number | null = null;
  private _tokensEnabled = true;
  private _choices: Promise<ITokenChoices> | null = null;
  private _runningPaths = new Set<string>(); // notebooks with a cell marked running
  private _problems = new Map<string, string>();
  private _maxChanges = 20;
  private _errors = new Map<'sessions' | 'changes' | 'approvals', string>();
  private _notice: { text: string; ok: boolean } | null = null;
  private _sessionsTimer: ReturnType<typeof setTimeout> | undefined;
  private _noticeTimer: ReturnType<typeof setTimeout> | undefined;
  private _stateChanged = new Signal<this, void>(this);
  private _event = new Signal<this, IAgentEvent>(this);
  private _recorded = new Signal<this, IChange>(this);
  private _asked = new Signal<this, IApproval>(this);
  private _settled = new Signal<this, number>(this);
  private _written = new Signal<this, { path: string; change: IChange | null }>(
    this
  );
  private _running = new Signal<this, { path: string; cellId: string | null }>(
    this
  );
}
