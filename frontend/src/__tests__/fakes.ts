/**
 * What the model is made of, faked at its seams (not by mocking globals): the server's routes
 * (`AgentApi`), its event source (`IAgentEventSource`), and a WebSocket class for `AgentEvents` (a
 * server connection setting). Shared by the model's, the panel's and the marks' tests.
 */
import { MessageLoop } from '@lumino/messaging';
import { ISignal, Signal } from '@lumino/signaling';

import {
  ApiError,
  IAgentEvent,
  IAgentToken,
  IApproval,
  IChange,
  IChangeDetail,
  ISession,
  LEDGER_CHANGE_EVENT
} from '../api';
import { IAgentEventSource } from '../events';
import { AgentApi } from '../model';

/** The event bus as the model hears it: tests emit its events and its connection. */
export class FakeSource implements IAgentEventSource {
  readonly event = new Signal<this, IAgentEvent>(this);
  readonly connection = new Signal<this, boolean>(this);
  isDisposed = false;
  dispose(): void {
    this.isDisposed = true;
    Signal.clearData(this);
  }
}

/** The server's routes: answers set by the test, each call counted. */
export class FakeApi implements AgentApi {
  readonly settings = {} as AgentApi['settings'];
  sessionList: ISession[] = [];
  changeList: IChange[] = [];
  pending: IApproval[] = [];
  tokenList: IAgentToken[] = [];
  details = new Map<string, IChangeDetail>();
  /** A route name -> the error it fails with (until removed). */
  failing = new Map<string, Error>();
  calls: string[] = [];

  count(route: string): number {
    return this.calls.filter(c => c === route).length;
  }

  request<T>(): Promise<T> {
    return Promise.reject(new Error('not faked'));
  }
  sessions(): Promise<{ sessions: ISession[] }> {
    return this._answer('sessions', () => ({ sessions: this.sessionList }));
  }
  changes(limit: number): Promise<{ changes: IChange[] }> {
    return this._answer('changes', () => ({
      changes: this.changeList.slice(0, limit)
    }));
  }
  change(path: string, id: string): Promise<IChangeDetail> {
    return this._answer('change', () => {
      const detail = this.details.get(id);
      if (!detail) {
        throw new ApiError(404, `no change ${id} of ${path}`, {});
      }
      return detail;
    });
  }
  undo(): Promise<{ message: string; outputs_cleared?: string[] }> {
    return this._answer('undo', () => ({ message: 'undone' }));
  }
  approvals(): Promise<{ pending: IApproval[]; recent: IApproval[] }> {
    return this._answer('approvals', () => ({
      pending: this.pending,
      recent: []
    }));
  }
  approval(id: number): Promise<IApproval> {
    return this._answer('approval', () => {
      const found = this.pending.find(a => a.id === id);
      if (!found) {
        throw new ApiError(404, `no request ${id}`, {});
      }
      return found;
    });
  }
  decide(id: number): Promise<IApproval> {
    return this._answer('decide', () => this.pending.find(a => a.id === id)!);
  }
  tokens(): Promise<unknown> {
    return this._answer('tokens', () => ({
      tokens: this.tokenList,
      max_lifetime: null
    }));
  }
  createToken(): Promise<any> {
    return this._answer('createToken', () => ({}));
  }
  revokeToken(): Promise<any> {
    return this._answer('revokeToken', () => ({}));
  }
  contract(): Promise<unknown> {
    return this._answer('contract', () => ({}));
  }
  stop(): Promise<unknown> {
    return this._answer('stop', () => ({}));
  }
  interrupt(): Promise<unknown> {
    return this._answer('interrupt', () => ({}));
  }

  private async _answer<T>(route: string, answer: () => T): Promise<T> {
    this.calls.push(route);
    await Promise.resolve();
    const error = this.failing.get(route);
    if (error) {
      throw error;
    }
    return answer();
  }
}

/** Wait for the model's reads (promises and its 50 ms burst timer) to settle. */
export function settle(ms = 0): Promise<void> {
  return new Promise(resolve => setTimeout(resolve, ms));
}

/** What the widgets were asked to draw is drawn: lumino's pending update requests, then React's
 * rendering (scheduled: a macrotask later), again until the page stops changing (a model's reads
 * that end meanwhile ask for more drawing; a loaded machine takes longer than any fixed wait). */
export async function drawn(): Promise<void> {
  let before: string | null = null;
  for (let round = 0; round < 100; round++) {
    MessageLoop.flush();
    await settle(10);
    const now = document.body.innerHTML;
    if (now === before) {
      return;
    }
    before = now;
  }
}

/** Every emission of `signal`, in order. */
export function record<T, U>(signal: ISignal<T, U>): U[] {
  const seen: U[] = [];
  signal.connect((_, args) => void seen.push(args));
  return seen;
}

export function change(
  id: string,
  path = 'a.ipynb',
  more: Partial<IChange> = {}
): IChange {
  return {
    id,
    time: '2026-12-07T12:00:00Z',
    path,
    user: 'agent:ci',
    via: 'http',
    kind: 'notebook',
    action: 'edit cell',
    undoes: null,
    undoable: true,
    cells: [{ id: 'c1', what: ['source'], index_before: 0, index_after: 0 }],
    ...more
  };
}

export function changeEvent(c: IChange): IAgentEvent {
  const { id, ...rest } = c;
  return { schema_id: LEDGER_CHANGE_EVENT, change_id: id, ...rest };
}

export function session(name: string, more: Partial<ISession> = {}): ISession {
  return {
    name,
    kernel_id: 'k-' + name,
    kernel_name: 'python3',
    mode: 'eval',
    notebook: null,
    state: 'idle',
    last_used: '2026-12-07T12:00:00Z',
    busy: false,
    queue_depth: 0,
    owner: 'agent:ci',
    ...more
  };
}

export function approval(id: number, more: Partial<IApproval> = {}): IApproval {
  return {
    id,
    agent: 'agent:ci',
    door: 'http',
    action: 'execute',
    path: 'a.ipynb',
    summary: `run 1 cell in a.ipynb (${id})`,
    state: 'pending',
    created: '2026-12-07T12:00:00Z',
    expires: '2026-12-07T12:10:00Z',
    decided_by: null,
    decided: null,
    reason: null,
    for_seconds: null,
    details: { cells: [{ code: 'print(1)' }] },
    ...more
  };
}

export function token(name: string, more: Partial<IAgentToken> = {}) {
  return {
    name,
    scopes: ['read'],
    paths: [],
    status: 'active' as const,
    created: '2026-12-07T12:00:00Z',
    expires: null,
    last_used: null,
    revoked: null,
    ask: [],
    ...more
  };
}
