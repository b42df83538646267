#!/usr/bin/env python3
# A headers exchange, a mandatory publication returned, basic.get with
# and without auto_ack, and an auto-delete queue, with pika as a
# RabbitMQ program writes them (node/amqp_pika_test.go runs it).
import os

import pika

port = int(os.environ.get('AMQP_PORT', '5672'))
connection = pika.BlockingConnection(pika.ConnectionParameters(host='127.0.0.1', port=port))
channel = connection.channel()

channel.exchange_declare(exchange='docs', exchange_type='headers')
channel.queue_declare(queue='pdfs')
channel.queue_bind(queue='pdfs', exchange='docs', arguments={'x-match': 'all', 'format': 'pdf'})
channel.queue_declare(queue='tagged')
channel.queue_bind(queue='tagged', exchange='docs', arguments={'x-match': 'any', 'tag': None, 'urgent': True})

channel.confirm_delivery()
for body, headers in [('report.pdf', {'format': 'pdf'}), ('notes.txt', {'format': 'txt', 'tag': 'x'}), ('alarm.pdf', {'format': 'pdf', 'urgent': True})]:
    channel.basic_publish(exchange='docs', routing_key='', body=body, properties=pika.BasicProperties(headers=headers))
    print(" [x] Sent %r" % body)
try:
    channel.basic_publish(exchange='docs', routing_key='', body='lost.doc', properties=pika.BasicProperties(headers={'format': 'doc'}), mandatory=True)
except pika.exceptions.UnroutableError:
    print(" [x] Returned 'lost.doc'")

for queue in ['pdfs', 'tagged']:
    while True:
        method, properties, body = channel.basic_get(queue=queue, auto_ack=False)
        if method is None:
            print(" [x] %s is empty" % queue)
            break
        print(" [x] Got %r from %s, %d left" % (body.decode(), queue, method.message_count))
        channel.basic_ack(method.delivery_tag)

result = channel.queue_declare(queue='', auto_delete=True)
temp = result.method.queue
tag = channel.basic_consume(queue=temp, on_message_callback=lambda *args: None, auto_ack=True)
channel.basic_cancel(tag)
try:
    channel.queue_declare(queue=temp, passive=True)
    print(" [x] %s still there" % temp)
except pika.exceptions.ChannelClosedByBroker as e:
    print(" [x] Auto-delete queue gone: %d" % e.reply_code)
connection.close()
