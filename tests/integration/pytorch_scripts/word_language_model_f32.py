#!/usr/bin/env python3
# word_language_model's training loop in float32, PyTorch's default dtype (word_language_model.py
# is float64): an LSTM over a token stream batchified into 20 columns, bptt chunks with the hidden
# state detached between them, the mean NLL loss, gradient clipping and an SGD update written by
# hand. No DataLoader, so every rank computes the whole batch: at any number of ranks the job must
# train bitwise the model it trains alone (the mean of N equal float32 gradients is each of them).
import torch
import torch.nn as nn

torch.manual_seed(1111)
ntokens, bptt, batch_size, lr, clip = 50, 35, 20, 20.0, 0.25
transitions = torch.softmax(3 * torch.randn(ntokens, ntokens), dim=1)
words = torch.zeros(batch_size * 36 * 8, dtype=torch.long)
for i in range(1, len(words)):
    words[i] = torch.multinomial(transitions[words[i - 1]], 1)
train_data = words.view(batch_size, -1).t().contiguous()


class RNNModel(nn.Module):
    def __init__(self):
        super(RNNModel, self).__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(ntokens, 16)
        self.rnn = nn.LSTM(16, 16, 2, dropout=0.2)
        self.decoder = nn.Linear(16, ntokens)

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(input)), hidden)
        decoded = self.decoder(self.drop(output)).view(-1, ntokens)
        return nn.functional.log_softmax(decoded, dim=1), hidden


model = RNNModel()
criterion = nn.NLLLoss()
for epoch in range(1, 3):
    model.train()
    hidden = (torch.zeros(2, batch_size, 16), torch.zeros(2, batch_size, 16))
    for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
        seq_len = min(bptt, len(train_data) - 1 - i)
        data, targets = train_data[i:i + seq_len], train_data[i + 1:i + 1 + seq_len].reshape(-1)
        hidden = tuple(h.detach() for h in hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        print('| epoch {:3d} | batch {:3d} | loss {:.9g}'.format(epoch, batch, loss.item()))
torch.save(model.state_dict(), 'model.pt')
