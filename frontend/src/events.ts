/**
 * The server's event bus (`/api/events/subscribe`) through JupyterLab's own client, `EventManager`, and
 * its reconnecting poll. The frontend makes its own manager over the application's server settings
 * (`app.serviceManager.serverSettings`) rather than sharing `app.serviceManager.events`, because that
 * one says nothing of its connection: after a server restart the panel must know when the bus is back
 * to read what it missed meanwhile.
 */
import { EventManager, ServerConnection } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { IAgentEvent } from './api';

/** Where the model hears the server's events: its events, and its connection opening and closing. */
export interface IAgentEventSource extends IDisposable {
  /** Every event of the bus that has a schema. */
  readonly event: ISignal<unknown, IAgentEvent>;
  /** True when the bus connects (again), false when it drops. */
  readonly connection: ISignal<unknown, boolean>;
}

export class AgentEvents implements IAgentEventSource {
  constructor(settings: ServerConnection.ISettings) {
    const connection = this._connection;
    const Base = settings.WebSocket;
    // The manager's socket, told to the connection signal as it opens and closes.
    class Tracked extends Base {
      constructor(url: string | URL, protocols?: string | string[]) {
        super(url, protocols);
        this.addEventListener('open', () => connection.emit(true));
        this.addEventListener('close', () => connection.emit(false));
      }
    }
    this._manager = new EventManager({
      serverSettings: { ...settings, WebSocket: Tracked as typeof WebSocket }
    });
    this._manager.stream.connect(this._onEvent, this);
  }

  /** Every event of the bus that has a schema. */
  get event(): ISignal<this, IAgentEvent> {
    return this._event;
  }

  /** True when the bus's socket opens, false when it closes (it is opened again by the poll). */
  get connection(): ISignal<this, boolean> {
    return this._connection;
  }

  get isDisposed(): boolean {
    return this._manager.isDisposed;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._manager.dispose();
    Signal.clearData(this);
  }

  private _onEvent(_: unknown, event: { [key: string]: any }): void {
    if (typeof event?.schema_id === 'string') {
      this._event.emit(event as IAgentEvent);
    }
  }

  private _manager: EventManager;
  private _event = new Signal<this, IAgentEvent>(this);
  private _connection = new Signal<this, boolean>(this);
}
