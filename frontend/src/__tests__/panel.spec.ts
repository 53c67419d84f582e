/**
 * The Agents panel rendered from a model (the real `AgentModel` over a fake source and API): its rows,
 * their ids and actions, what is drawn again and what is kept, the tab's count of requests.
 */
import { CommandRegistry } from '@lumino/commands';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';
import { Widget } from '@lumino/widgets';

import { AgentModel } from '../model';
import { AgentPanel, PANEL_ID, PENDING_DATASET_KEY } from '../panel';
import {
  approval,
  change,
  changeEvent,
  drawn,
  FakeApi,
  FakeSource,
  session,
  settle,
  token
} from './fakes';

function rows(panel: AgentPanel, section: string): HTMLElement[] {
  return Array.from(
    panel.node.querySelectorAll<HTMLElement>(`[data-section="${section}"] li`)
  );
}

describe('AgentPanel from a model', () => {
  let api: FakeApi;
  let source: FakeSource;
  let model: AgentModel;
  let commands: CommandRegistry;
  let ran: [string, ReadonlyPartialJSONObject][];
  let panel: AgentPanel;

  beforeEach(async () => {
    api = new FakeApi();
    source = new FakeSource();
    model = new AgentModel(api, source);
    commands = new CommandRegistry();
    ran = [];
    for (const id of ['agents:undo', 'agents:approve', 'agents:interrupt']) {
      commands.addCommand(id, { execute: args => void ran.push([id, args]) });
    }
    api.sessionList = [
      session('eval-1', { busy: true, busy_since: '2026-12-07T12:00:00Z' }),
      session('nb', { mode: 'notebook', notebook: 'r.ipynb' })
    ];
    api.changeList = [change('2', 'b.ipynb'), change('1')];
    api.pending = [approval(4)];
    api.tokenList = [token('ci'), token('old', { status: 'revoked' })];
    panel = new AgentPanel(model, commands);
    Widget.attach(panel, document.body);
    source.connection.emit(true);
    await settle();
    await drawn();
  });

  afterEach(() => {
    panel.dispose();
    model.dispose();
  });

  it('shows what the model holds, each row with its id', () => {
    expect(panel.id).toBe(PANEL_ID);
    expect(panel.node.dataset.connected).toBe('true');
    expect(
      panel.node.querySelector('.jp-AgentActivity-status')?.textContent
    ).toBe('live');
    // (a notebook's own kernel shows as its run, not as a session)
    expect(rows(panel, 'sessions').map(r => r.dataset.session)).toEqual([
      'eval-1'
    ]);
    expect(rows(panel, 'runs-in-progress').map(r => r.dataset.run)).toEqual([
      'eval-1'
    ]);
    expect(rows(panel, 'recent-changes').map(r => r.dataset.changeId)).toEqual([
      '2',
      '1'
    ]);
    expect(
      rows(panel, 'waiting-for-you').map(r => r.dataset.approvalId)
    ).toEqual(['4']);
    expect(rows(panel, 'agent-tokens').map(r => r.dataset.token)).toEqual([
      'ci',
      'old'
    ]);
    // (a revoked token has no Revoke)
    expect(
      rows(panel, 'agent-tokens').map(
        r => r.querySelector('[data-action="revoke"]') !== null
      )
    ).toEqual([true, false]);
    expect(panel.title.dataset[PENDING_DATASET_KEY]).toBe('1');
    expect(panel.title.caption).toBe('Agents: 1 request waiting for you');
  });

  it('draws a new change on top and keeps the rows that did not change', async () => {
    const [newest, older] = rows(panel, 'recent-changes');
    source.event.emit(changeEvent(change('3')));
    await drawn();
    const now = rows(panel, 'recent-changes');
    expect(now.map(r => r.dataset.changeId)).toEqual(['3', '2', '1']);
    expect(now[1]).toBe(newest);
    expect(now[2]).toBe(older);
  });

  it("keeps a request's typed reason while the list is drawn again, and counts requests on the tab", async () => {
    const reason = rows(panel, 'waiting-for-you')[0].querySelector(
      'input[data-field="reason"]'
    ) as HTMLInputElement;
    reason.value = 'not now';
    api.pending = [approval(4), approval(5)];
    await model.loadApprovals();
    await drawn();
    const [first, second] = rows(panel, 'waiting-for-you');
    expect(first.querySelector('input')).toBe(reason);
    expect(reason.value).toBe('not now');
    expect(second.dataset.approvalId).toBe('5');
    expect(panel.title.dataset[PENDING_DATASET_KEY]).toBe('2');

    source.event.emit({
      schema_id: 'https://events.jupyter.org/jupyter_agent_tools/approval/v1',
      event: 'approved',
      approval_id: 4
    });
    source.event.emit({
      schema_id: 'https://events.jupyter.org/jupyter_agent_tools/approval/v1',
      event: 'denied',
      approval_id: 5
    });
    await drawn();
    expect(rows(panel, 'waiting-for-you')).toEqual([]);
    expect(
      panel.node.querySelector<HTMLElement>('[data-section="waiting-for-you"]')
        ?.hidden
    ).toBe(true);
    expect(panel.title.dataset[PENDING_DATASET_KEY]).toBeUndefined();
  });

  it("runs a row's command with the row's arguments", async () => {
    const click = (row: HTMLElement, action: string) =>
      row
        .querySelector<HTMLButtonElement>(`button[data-action="${action}"]`)!
        .click();
    click(rows(panel, 'recent-changes')[0], 'undo');
    click(rows(panel, 'waiting-for-you')[0], 'approve-for');
    click(rows(panel, 'runs-in-progress')[0], 'interrupt');
    await settle();
    expect(ran).toEqual([
      ['agents:undo', { path: 'b.ipynb', id: '2' }],
      ['agents:approve', { id: 4, for_seconds: 600 }],
      ['agents:interrupt', { session: 'eval-1' }]
    ]);
  });

  it('says when the bus is lost, what could not be read, and a refused undo on its change', async () => {
    source.connection.emit(false);
    await drawn();
    expect(panel.node.dataset.connected).toBe('false');
    expect(
      panel.node.querySelector('.jp-AgentActivity-status')?.textContent
    ).toBe('reconnecting…');

    api.failing.set('changes', new Error('the ledger is locked'));
    await model.loadChanges();
    await drawn();
    const error = panel.node.querySelector<HTMLElement>(
      '.jp-AgentActivity-notice.jp-mod-error'
    )!;
    expect(error.hidden).toBe(false);
    expect(error.textContent).toBe('Error: the ledger is locked');

    api.failing.set('undo', new Error('cell changed since'));
    await model.act(() => model.undo(model.change('1')!), '1');
    await drawn();
    const row = rows(panel, 'recent-changes')[1];
    expect(row.dataset.changeId).toBe('1');
    expect(row.querySelector('.jp-AgentActivity-problem')?.textContent).toBe(
      'Error: cell changed since'
    );
  });

  it('marks a revealed request, also one the list has only later', async () => {
    // (jsdom lays nothing out: it has no scrollIntoView; the rows scrolled to are noted)
    const scrolled: string[] = [];
    HTMLElement.prototype.scrollIntoView = function (this: HTMLElement) {
      scrolled.push(this.dataset.approvalId ?? '');
    };
    panel.reveal(6);
    await drawn();
    expect(scrolled).toEqual([]);
    api.pending = [approval(4), approval(6)];
    await model.loadApprovals();
    await drawn();
    const revealed = rows(panel, 'waiting-for-you').filter(r =>
      r.classList.contains('jp-mod-revealed')
    );
    expect(revealed.map(r => r.dataset.approvalId)).toEqual(['6']);
    expect(scrolled).toEqual(['6']);
    delete (HTMLElement.prototype as any).scrollIntoView;
  });
});
