/**
 * The model, driven through its seams: fake server events in (a `FakeSource`, and once the real
 * `AgentEvents` over a fake WebSocket), a fake API answering its reads; its state and signals out.
 */
import { ServerConnection } from '@jupyterlab/services';

import { APPROVAL_EVENT, NOTEBOOK_CHANGE_EVENT, SESSION_EVENT } from '../api';
import { AgentEvents } from '../events';
import { AgentModel } from '../model';
import {
  approval,
  change,
  changeEvent,
  FakeApi,
  FakeSource,
  record,
  session,
  settle,
  token
} from './fakes';

function made(): { api: FakeApi; source: FakeSource; model: AgentModel } {
  const api = new FakeApi();
  const source = new FakeSource();
  return { api, source, model: new AgentModel(api, source) };
}

describe('AgentModel: connecting', () => {
  it('reads sessions, changes, requests and tokens once the bus connects', async () => {
    const { api, source, model } = made();
    api.sessionList = [session('s1')];
    api.changeList = [change('2'), change('1')];
    api.pending = [approval(7)];
    api.tokenList = [token('ci')];
    const changed = record(model.stateChanged);
    expect(model.connected).toBe(false);
    expect(api.calls).toEqual([]);

    source.connection.emit(true);
    await settle();

    expect(model.connected).toBe(true);
    expect(model.sessions.map(s => s.name)).toEqual(['s1']);
    expect(model.changes.map(c => c.id)).toEqual(['2', '1']);
    expect(model.approvals.map(a => a.id)).toEqual([7]);
    expect(model.tokens.map(t => t.name)).toEqual(['ci']);
    expect(model.error).toBe('');
    expect(changed.length).toBeGreaterThanOrEqual(5);
    for (const route of ['sessions', 'changes', 'approvals', 'tokens']) {
      expect(api.count(route)).toBe(1);
    }
    model.dispose();
  });

  it('says what could not be read, and forgets it once a read succeeds', async () => {
    const { api, source, model } = made();
    api.failing.set('sessions', new Error('server gone'));
    source.connection.emit(true);
    await settle();
    expect(model.error).toBe('Error: server gone');
    api.failing.delete('sessions');
    await model.loadSessions();
    expect(model.error).toBe('');
    model.dispose();
  });

  it('drops and reconnects: shows it, and reads again what it missed meanwhile', async () => {
    const { api, source, model } = made();
    api.changeList = [change('1')];
    source.connection.emit(true);
    await settle();
    expect(model.changes.map(c => c.id)).toEqual(['1']);

    const changed = record(model.stateChanged);
    source.connection.emit(false);
    expect(model.connected).toBe(false);
    expect(changed.length).toBe(1);
    // (a second "closed" while the poll retries changes nothing)
    source.connection.emit(false);
    expect(changed.length).toBe(1);

    api.changeList = [change('3'), change('2'), change('1')]; // made while the page was not listening
    api.pending = [approval(9)];
    source.connection.emit(true);
    await settle();

    expect(model.connected).toBe(true);
    expect(model.changes.map(c => c.id)).toEqual(['3', '2', '1']);
    expect(model.approvals.map(a => a.id)).toEqual([9]);
    for (const route of ['sessions', 'changes', 'approvals', 'tokens']) {
      expect(api.count(route)).toBe(2);
    }
    model.dispose();
  });

  it('disposes its event source with itself', () => {
    const { source, model } = made();
    model.dispose();
    expect(model.isDisposed).toBe(true);
    expect(source.isDisposed).toBe(true);
  });
});

describe('AgentModel: events in, state out', () => {
  it('puts a recorded change on top, tells it as recorded and written, and keeps maxChanges', async () => {
    const { api, source, model } = made();
    api.changeList = [change('1'), change('0')];
    source.connection.emit(true);
    await settle();
    model.maxChanges = 2;
    await settle();
    const recorded = record(model.recorded);
    const written = record(model.written);

    source.event.emit(changeEvent(change('2', 'b.ipynb')));

    expect(model.changes.map(c => c.id)).toEqual(['2', '1']);
    expect(model.change('2')?.path).toBe('b.ipynb');
    expect(recorded.map(c => c.id)).toEqual(['2']);
    expect(written).toEqual([{ path: 'b.ipynb', change: model.change('2') }]);
    model.dispose();
  });

  it('keeps a change told while the list is read in front of the older answer', async () => {
    const { api, source, model } = made();
    api.changeList = [change('1')]; // the list's answer predates change 2
    const reading = model.loadChanges();
    source.event.emit(changeEvent(change('2')));
    await reading;
    expect(model.changes.map(c => c.id)).toEqual(['2', '1']);
    model.dispose();
  });

  it('re-emits every event of the bus, and tells a notebook written by an edit (without a change)', () => {
    const { source, model } = made();
    const events = record(model.event);
    const written = record(model.written);
    const edit = { schema_id: NOTEBOOK_CHANGE_EVENT, path: 'n.ipynb' };
    source.event.emit(edit);
    expect(events).toEqual([edit]);
    expect(written).toEqual([{ path: 'n.ipynb', change: null }]);
    model.dispose();
  });

  it('reads a new request in full, tells it as asked, and settles it when decided', async () => {
    const { api, source, model } = made();
    const asked = record(model.asked);
    const settled = record(model.settled);
    api.pending = [approval(4)];

    source.event.emit({
      schema_id: APPROVAL_EVENT,
      event: 'requested',
      approval_id: 4
    });
    await settle();
    expect(model.approvals.map(a => a.id)).toEqual([4]);
    expect(asked.map(a => a.summary)).toEqual(['run 1 cell in a.ipynb (4)']);

    // (told twice: asked once)
    source.event.emit({
      schema_id: APPROVAL_EVENT,
      event: 'requested',
      approval_id: 4
    });
    await settle();
    expect(asked.length).toBe(1);

    source.event.emit({
      schema_id: APPROVAL_EVENT,
      event: 'approved',
      approval_id: 4
    });
    expect(model.approvals).toEqual([]);
    expect(settled).toEqual([4]);
    model.dispose();
  });

  it('reads the sessions once per burst of session events, and tells the cell a run runs', async () => {
    const { api, source, model } = made();
    const running = record(model.running);
    api.sessionList = [
      session('nb', {
        mode: 'notebook',
        notebook: 'r.ipynb',
        busy: true,
        running_cell: { index: 1, cell_id: 'cell-b' }
      })
    ];
    for (const action of ['queued', 'started', 'cell_started']) {
      source.event.emit({ schema_id: SESSION_EVENT, action, mode: 'eval' });
    }
    expect(api.count('sessions')).toBe(0);
    await settle(80);
    expect(api.count('sessions')).toBe(1);
    expect(running).toEqual([{ path: 'r.ipynb', cellId: 'cell-b' }]);

    api.sessionList = [
      session('nb', { mode: 'notebook', notebook: 'r.ipynb' })
    ];
    source.event.emit({ schema_id: SESSION_EVENT, action: 'call_ended' });
    await settle(80);
    expect(running).toEqual([
      { path: 'r.ipynb', cellId: 'cell-b' },
      { path: 'r.ipynb', cellId: null }
    ]);
    model.dispose();
  });

  it('a refused undo is the problem of its change; a success is the notice', async () => {
    const { api, model } = made();
    const c = change('5');
    api.failing.set('undo', new Error('conflict'));
    await model.act(() => model.undo(c), c.id);
    expect(model.problems.get('5')).toBe('Error: conflict');
    expect(model.notice).toBeNull();

    api.failing.delete('undo');
    await model.act(() => model.undo(c), c.id);
    expect(model.problems.has('5')).toBe(false);
    expect(model.notice?.ok).toBe(true);
    model.dispose();
  });
});

/** A WebSocket the test opens, feeds and closes (handed to `AgentEvents` in the server settings). */
class FakeSocket extends EventTarget {
  static made: FakeSocket[] = [];
  onopen: ((event: Event) => void) | null = null;
  onclose: ((event: Event) => void) | null = null;
  onerror: ((event: Event) => void) | null = null;
  onmessage: ((event: MessageEvent) => void) | null = null;
  constructor(readonly url: string) {
    super();
    FakeSocket.made.push(this);
  }
  open(): void {
    const event = new Event('open');
    this.dispatchEvent(event);
    this.onopen?.(event);
  }
  message(data: unknown): void {
    this.onmessage?.(
      new MessageEvent('message', { data: JSON.stringify(data) })
    );
  }
  close(): void {
    const event = new Event('close');
    this.dispatchEvent(event);
    this.onclose?.(event);
  }
}

describe('AgentModel over AgentEvents (EventManager), the socket faked', () => {
  it('subscribes, hears events, and after the socket drops subscribes again and reads again', async () => {
    FakeSocket.made = [];
    const settings = ServerConnection.makeSettings({
      baseUrl: 'http://localhost:8888/',
      wsUrl: 'ws://localhost:8888/',
      WebSocket: FakeSocket as unknown as typeof WebSocket
    });
    const api = new FakeApi();
    const model = new AgentModel(api, new AgentEvents(settings));
    await settle(20);
    expect(FakeSocket.made.length).toBe(1);
    const first = FakeSocket.made[0];
    expect(first.url).toBe('ws://localhost:8888/api/events/subscribe');

    first.open();
    await settle();
    expect(model.connected).toBe(true);
    expect(api.count('changes')).toBe(1);
    first.message(changeEvent(change('1')));
    expect(model.changes.map(c => c.id)).toEqual(['1']);
    first.message({ no: 'schema' }); // (not an event of ours: ignored)

    first.close();
    expect(model.connected).toBe(false);
    // The manager's poll subscribes again (after its backoff): a new socket.
    for (let i = 0; i < 100 && FakeSocket.made.length < 2; i++) {
      await settle(50);
    }
    expect(FakeSocket.made.length).toBe(2);
    api.changeList = [change('2'), change('1')];
    FakeSocket.made[1].open();
    await settle();
    expect(model.connected).toBe(true);
    expect(api.count('changes')).toBe(2);
    expect(model.changes.map(c => c.id)).toEqual(['2', '1']);
    model.dispose();
  }, 15000);
});
