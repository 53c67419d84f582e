/**
 * The server's routes and events the panel reads: it shows what they say and asks them to act.
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

/** An event of the server's event bus (`/api/events/subscribe`): its schema and its data. */
export interface IAgentEvent {
  schema_id: string;
  [key: string]: any;
}

export const EVENTS = 'https://events.jupyter.org/jupyter_agent_tools/';
export const SESSION_EVENT = `${EVENTS}session/v1`;
export const EXECUTION_EVENT = `${EVENTS}execution/v1`;
export const LEDGER_CHANGE_EVENT = `${EVENTS}ledger_change/v1`;

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

/** Call a route under the server's base URL; the JSON answer, or an ApiError with its message. */
export async function request<T>(
  path: string,
  init: RequestInit = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ApiError(0, `The server cannot be reached: ${error}`, null);
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

/** A notebook path as a URL path (each segment encoded). */
export function notebookUrl(path: string): string {
  return `api/agent/notebooks/${URLExt.encodeParts(path)}`;
}

/**
 * The server's event bus, with a new connection after it closes (a server restart): 1 s, then
 * doubling up to 10 s between tries. Nothing is sent or polled while the connection is open.
 */
export class EventStream {
  constructor(
    private readonly onEvent: (event: IAgentEvent) => void,
    private readonly onState: (connected: boolean) => void
  ) {}

  start(): void {
    this._connect();
  }

  dispose(): void {
    this._disposed = true;
    clearTimeout(this._timer);
    this._socket?.close();
  }

  private _connect(): void {
    const settings = ServerConnection.makeSettings();
    let url = URLExt.join(settings.wsUrl, 'api/events/subscribe');
    if (settings.token) {
      url += `?token=${encodeURIComponent(settings.token)}`;
    }
    const socket = (this._socket = new settings.WebSocket(url));
    socket.onopen = () => {
      this._delay = 1000;
      this.onState(true);
    };
    socket.onmessage = message => {
      let event: IAgentEvent;
      try {
        event = JSON.parse(message.data);
      } catch {
        return;
      }
      if (typeof event?.schema_id === 'string') {
        this.onEvent(event);
      }
    };
    socket.onclose = () => {
      if (this._disposed) {
        return;
      }
      this.onState(false);
      this._timer = setTimeout(() => this._connect(), this._delay);
      this._delay = Math.min(this._delay * 2, 10000);
    };
  }

  private _socket: WebSocket | null = null;
  private _delay = 1000;
  private _timer: ReturnType<typeof setTimeout> | undefined;
  private _disposed = false;
}
