/**
 * The server's routes and events the frontend reads: it shows what they say and asks them to act.
 * See docs/api.md (sessions, the change ledger) and docs/admin.md (the audit events).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** A session as `GET /api/agent/sessions` lists it (the fields the panel shows). */
export interface ISession {
  name: string;
  kernel_id: string | null;
  kernel_name: string | null;
  mode: string;
  notebook: string | null;
  state: string;
  last_used: string;
  busy: boolean;
  busy_since?: string | null;
  /** The cell the running call runs: its index (in the eval request, or the notebook), a notebook's
   * cell id, an eval's cell count. */
  running_cell?: {
    index: number;
    cell_id?: string | null;
    of?: number | null;
  } | null;
  queue_depth: number;
  owner: string | null;
}

/** One cell a recorded change touched. */
export interface IChangeCell {
  id: string | null;
  what: string[];
  index_before: number | null;
  index_after: number | null;
}

/** A change-ledger entry (`GET /api/agent/changes`, the `ledger_change` event). */
export interface IChange {
  id: string;
  time: string;
  path: string;
  user: string | null;
  via: string | null;
  kind: string;
  action: string;
  undoes: string | null;
  /** For a save that overwrote agents' changes (`action` `overwrite`): the changes it overwrote. */
  overwrites?: string[] | null;
  undoable: boolean;
  cells: IChangeCell[];
}

/** One cell of `GET /api/agent/notebooks/{path}/changes/{id}`, with what it was and became. */
export interface IChangeDetailCell extends IChangeCell {
  before: { [key: string]: any } | null;
  after: { [key: string]: any } | null;
  diff?: string;
}

export interface IChangeDetail extends IChange {
  cells: IChangeDetailCell[];
}

/** A request waiting for the person's decision (`GET /api/agent/approvals`), see docs/approvals.md. */
export interface IApproval {
  id: number;
  /** The agent that asks (`agent:NAME`). */
  agent: string;
  /** Through which door it asked: `http`, `mcp`, `cli`. */
  door: string;
  /** `read`, `edit`, `execute` or `kernel`. */
  action: string;
  path: string | null;
  /** What it asks to do, in a line (`run 2 cells in report.ipynb`). */
  summary: string;
  /** `withdrawn`: the agent's call that asked went away before the person decided. */
  state: 'pending' | 'approved' | 'denied' | 'expired' | 'withdrawn';
  created: string;
  expires: string;
  decided_by: string | null;
  decided: string | null;
  reason: string | null;
  for_seconds: number | null;
  /** What would happen exactly: an eval's `cells` (code), a run's or an edit's cells, an undo's change. */
  details?: { [key: string]: any };
  /** Bytes of `details` not shown (cut to the server's max_detail_bytes); 0: all of them. */
  truncated?: number;
  /** In the list only: true when `details` is a preview (the full request is one GET away). */
  preview?: boolean;
}

/** The person's decision (`POST /api/agent/approvals/{id}`). */
export interface IDecision {
  decision: 'approve' | 'deny';
  for_seconds?: number;
  reason?: string;
}

/** An agent token as `GET /api/agent/tokens` lists it (never the token itself), see docs/api.md. */
export interface IAgentToken {
  name: string;
  scopes: string[];
  paths: string[];
  status: 'active' | 'expired' | 'revoked';
  created: string;
  expires: string | null;
  /** Kept to the minute by the server. */
  last_used: string | null;
  revoked: string | null;
  /** The actions it asks the person for first (the approval gate). */
  ask: string[];
}

/** A new agent token (`POST /api/agent/tokens`, the schema `AgentTokenRequest`). */
export interface ITokenRequest {
  name: string;
  scopes: string[];
  paths?: string[];
  ask?: string[];
  /** Seconds until it expires; absent: never. */
  expires_in?: number;
}

/** The answer of `POST /api/agent/tokens`: the record, the token (shown this once), and warnings. */
export interface ICreatedToken extends IAgentToken {
  token: string;
  /** The user it acts as: `agent:NAME`. */
  user: string;
  warnings: string[];
}

/** An event of the server's event bus (`/api/events/subscribe`): its schema and its data. */
export interface IAgentEvent {
  schema_id: string;
  [key: string]: any;
}

export const EVENTS = 'https://events.jupyter.org/jupyter_agent_tools/';
export const SESSION_EVENT = `${EVENTS}session/v1`;
export const EXECUTION_EVENT = `${EVENTS}execution/v1`;
export const LEDGER_CHANGE_EVENT = `${EVENTS}ledger_change/v1`;
export const NOTEBOOK_CHANGE_EVENT = `${EVENTS}notebook_change/v1`;
/**
 * A request for the person's decision was made (`requested`) or ended (`approved`, `denied`, `expired`,
 * `withdrawn`): any end removes it from the pending ones.
 */
export const APPROVAL_EVENT = `${EVENTS}approval/v1`;

/** A change-ledger entry from its `ledger_change` event (the event names its id `change_id`). */
export function changeOfEvent(event: IAgentEvent): IChange {
  return { ...(event as any), id: String(event.change_id) } as IChange;
}

/**
 * The notebook an event says was (or may have been) written on disk: an edit's `notebook_change`, a
 * ledger entry, a notebook run's step (a run saves each cell's outputs when it ends, before the next
 * starts); null for any other event.
 */
export function writtenNotebook(event: IAgentEvent): string | null {
  switch (event.schema_id) {
    case NOTEBOOK_CHANGE_EVENT:
    case LEDGER_CHANGE_EVENT:
      return typeof event.path === 'string' ? event.path : null;
    case SESSION_EVENT:
      if (
        event.mode === 'notebook' &&
        typeof event.notebook === 'string' &&
        ['cell_started', 'call_ended', 'interrupted'].includes(event.action)
      ) {
        return event.notebook;
      }
      return null;
    case EXECUTION_EVENT:
      return event.mode === 'notebook' && typeof event.path === 'string'
        ? event.path
        : null;
  }
  return null;
}

/** An error answer of the server: its status and the message it gave. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly body: any
  ) {
    super(message);
  }
}

/** The server's routes, with the application's server settings. */
export class Api {
  constructor(readonly settings: ServerConnection.ISettings) {}

  /** Call a route under the server's base URL; the JSON answer, or an ApiError with its message. */
  async request<T>(path: string, init: RequestInit = {}): Promise<T> {
    const url = URLExt.join(this.settings.baseUrl, path);
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this.settings);
    } catch (error) {
      throw new ApiError(0, String(error), null);
    }
    const text = await response.text();
    let body: any = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      body = text;
    }
    if (!response.ok) {
      const message =
        (body && typeof body === 'object' && body.message) ||
        `${response.status} ${response.statusText}`;
      throw new ApiError(response.status, message, body);
    }
    return body as T;
  }

  sessions(): Promise<{ sessions: ISession[] }> {
    return this.request('api/agent/sessions');
  }

  changes(limit: number): Promise<{ changes: IChange[] }> {
    return this.request(`api/agent/changes?limit=${limit}`);
  }

  change(path: string, id: string): Promise<IChangeDetail> {
    return this.request(`${notebookUrl(path)}/changes/${id}`);
  }

  undo(
    path: string,
    id: string
  ): Promise<{ message: string; outputs_cleared?: string[] }> {
    return this.request(`${notebookUrl(path)}/changes/${id}/undo`, {
      method: 'POST',
      body: '{}'
    });
  }

  approvals(): Promise<{ pending: IApproval[]; recent: IApproval[] }> {
    return this.request('api/agent/approvals');
  }

  approval(id: number): Promise<IApproval> {
    return this.request(`api/agent/approvals/${id}`);
  }

  decide(id: number, decision: IDecision): Promise<IApproval> {
    return this.request(`api/agent/approvals/${id}`, {
      method: 'POST',
      body: JSON.stringify(decision)
    });
  }

  /** The agent tokens, oldest first (the raw answer: see `parseTokens`). */
  tokens(): Promise<unknown> {
    return this.request('api/agent/tokens');
  }

  createToken(request: ITokenRequest): Promise<ICreatedToken> {
    return this.request('api/agent/tokens', {
      method: 'POST',
      body: JSON.stringify(request)
    });
  }

  revokeToken(name: string): Promise<IAgentToken> {
    return this.request(`api/agent/tokens/${encodeURIComponent(name)}`, {
      method: 'DELETE'
    });
  }

  /** The server's contract of its agent routes (OpenAPI 3.1): what a new token may ask for. */
  contract(): Promise<unknown> {
    return this.request('api/agent/openapi.json');
  }

  stop(session: string): Promise<unknown> {
    return this.request(`api/agent/sessions/${encodeURIComponent(session)}`, {
      method: 'DELETE'
    });
  }

  /** Interrupt a session's call; a notebook run in the notebook's own kernel, as JupyterLab does. */
  interrupt(session: ISession): Promise<unknown> {
    if (session.mode === 'notebook' && session.kernel_id) {
      return this.request(`api/kernels/${session.kernel_id}/interrupt`, {
        method: 'POST'
      });
    }
    return this.request(
      `api/agent/sessions/${encodeURIComponent(session.name)}/interrupt`,
      { method: 'POST' }
    );
  }
}

/** A notebook path as a URL path (each segment encoded). */
export function notebookUrl(path: string): string {
  return `api/agent/notebooks/${URLExt.encodeParts(path)}`;
}
