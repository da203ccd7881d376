#!/usr/bin/env python3
# A word-language-model-style script (pytorch/examples' word_language_model): an LSTM over a token
# stream batchified into columns, truncated backpropagation through time in bptt chunks with the
# hidden state detached between them, gradient clipping and an SGD update written by hand, the
# learning rate annealed when the validation loss stops improving, the best model reloaded.
import math

import torch
import torch.nn as nn

torch.manual_seed(1111)
torch.set_default_dtype(torch.float64)
ntokens, bptt, batch_size, eval_batch_size, clip, log_interval = 24, 12, 10, 5, 0.25, 10


def synthetic_corpus(n):
    """A token stream from a random Markov chain (a stand-in for Wikitext-2)."""
    words = torch.empty(n, dtype=torch.long)
    words[0] = 0
    for i in range(1, n):
        words[i] = torch.multinomial(transitions[words[i - 1]], 1)
    return words


transitions = torch.softmax(3 * torch.randn(ntokens, ntokens), dim=1)
train_data_raw, val_data_raw, test_data_raw = synthetic_corpus(2400), synthetic_corpus(600), synthetic_corpus(600)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


train_data = batchify(train_data_raw, batch_size)
val_data = batchify(val_data_raw, eval_batch_size)
test_data = batchify(test_data_raw, eval_batch_size)


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2):
        super(RNNModel, self).__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.decoder.out_features)
        return nn.functional.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].view(-1)
    return data, target


model = RNNModel(ntokens, 16, 32, 2)
criterion = nn.NLLLoss()


def evaluate(data_source):
    model.eval()
    total_loss = 0.
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, bptt):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def train(epoch, lr):
    model.train()
    total_loss = 0.
    hidden = model.init_hidden(batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
        data, targets = get_batch(train_data, i)
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        total_loss += loss.item()
        if batch % log_interval == 0 and batch > 0:
            cur_loss = total_loss / log_interval
            print('| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | loss {:.6f} | ppl {:.6f}'.format(
                epoch, batch, len(train_data) // bptt, lr, cur_loss, math.exp(cur_loss)))
            total_loss = 0


lr, best_val_loss = 5.0, None
for epoch in range(1, 5):
    train(epoch, lr)
    val_loss = evaluate(val_data)
    print('| end of epoch {:3d} | valid loss {:.6f} | valid ppl {:.6f}'.format(epoch, val_loss, math.exp(val_loss)))
    if not best_val_loss or val_loss < best_val_loss:
        with open('model.pt', 'wb') as f:
            torch.save(model.state_dict(), f)
        best_val_loss = val_loss
    else:
        lr /= 4.0

with open('model.pt', 'rb') as f:
    model.load_state_dict(torch.load(f))
    model.rnn.flatten_parameters()
test_loss = evaluate(test_data)
print('| End of training | test loss {:.6f} | test ppl {:.6f}'.format(test_loss, math.exp(test_loss)))
